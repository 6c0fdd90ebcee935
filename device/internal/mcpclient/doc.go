// Package mcpclient is the bridge's MCP client toward one board, written for
// the firmware's dialect rather than the full MCP spec: integer ids within
// int32, no ping, no notifications, errors without codes, tools/list pages
// whose cursor is an inclusive tool name, and a server that runs one request
// at a time.
//
// A Client sends one request at a time (the board would run them serially
// anyway, and replies queue behind a running tool), through a bounded queue:
// a full queue fails fast with [ErrBusy]. A request's timeout runs from
// when it is made, time in the queue included: one whose time runs out
// before its turn is never sent and fails with [ErrQueueTimeout] (nothing
// happened), and so is one whose caller's context ends first. A request that
// was sent and times out is reported as [ErrTimeout], "outcome unknown",
// and is never retried: the board may still run it.
//
// [Client.Forward] lets a second MCP client share the board: its requests
// take their turn in the same queue under ids this client picks, so they
// never collide with the client's own, and its results come back raw.
package mcpclient
