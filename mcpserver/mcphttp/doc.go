// Package mcphttp is the HTTP front of /mcp: what happens to a request
// between the control listener's front door (package frontdoor, which
// checks Host, Origin and, with authn.Guard, credentials; mount Front
// behind it) and the go-sdk's Streamable HTTP handlers of one MCP server.
//
// A request goes through these steps, in this order, each in its own file:
//
//  1. rateLimit (ratelimit.go): mcp.rate_limit per known legacy session,
//     else per verified identity, else per client address; 429 with
//     Retry-After and a JSON-RPC error for the request's id.
//  2. bodyLimit (bodylimit.go): reads a POST body up to
//     mcp.max_body_bytes (413, with a JSON-RPC error when the id is
//     readable), re-buffers it, and puts what classify (classify.go) makes
//     of it in the request's context for the steps below.
//  3. bindLifetime (lifetime.go): the request ends when the server closes;
//     once it has closed, 503.
//  4. stripCaller (caller.go): the client cannot send a caller identity.
//  5. markTask (task.go): a legacy tools/call that asks for a task
//     (params.task, which go-sdk does not decode) says so in a header the
//     client cannot send itself.
//  6. route (route.go): the protocol era picks the handler.
//     - modern: setCaller (caller.go) sets the caller identity of
//     interactions, then the stateless go-sdk handler.
//     - legacy: sseRetry (sseretry.go: the SSE retry field, from
//     2025-11-25), admitSession (sessions.go: session caps, the idle
//     clock), trackCalls (tracker.go: withholding the result of a call
//     the client cancelled), then the stateful go-sdk handler, whose event
//     store (store.go) does the same for replays and forgets a closed
//     session.
//
// front.go builds the two handlers and the chain (New).
//
// Every mutex here (the rate limiter's, the cancellation tracker's, the
// session limits') is a leaf: nothing else is locked, and the go-sdk is
// not called, while it is held.
package mcphttp
