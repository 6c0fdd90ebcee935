// Package cluster joins bridges into a fleet over NATS. A [Node] publishes
// its Hub's boards to a JetStream key-value directory, watches the other
// nodes' heartbeats and boards, routes tool calls to the node that holds a
// board (request/reply), and, with a shared MQTT broker, arbitrates which
// node holds each board by claim ([Claims]). [Spent] is the fleet's replay
// store for flow tokens.
//
// A Node's state is in three parts, each behind its own mutex:
//   - directory (directory.go): its own records, the other nodes' boards
//     and heartbeats, and the tool catalogs. The Node's I/O around it is
//     in publish.go (its own boards), view.go (the other nodes) and gc.go
//     (unreferenced catalogs);
//   - router (calls.go): the routed calls in flight, both ways;
//   - claimState (claims.go): what ShareBoards set up and the claims
//     goroutine's queue of releases and adoptions.
//
// The Node itself owns the NATS connection, the goroutines (one WaitGroup)
// and the lifecycle (Start, Stop, Abandon); its rewatchMu guards only the
// list of watchers to restart on reconnect.
//
// Lock order: there is none to follow, because no lock is taken while
// another is held. directory.mu, router.mu, claimState.mu, Node.rewatchMu
// and the log throttles' locks are all leaves; a method that touches two
// parts (Claim, Release, halt, onBoard) takes one lock, lets it go, then
// takes the next. Nothing calls the Hub or does I/O under any of them;
// the router cancels contexts under its lock, which runs none of this
// package's code synchronously.
// Keep it so: a new method that needs two parts at once should instead
// move the state it needs into one part.
package cluster
