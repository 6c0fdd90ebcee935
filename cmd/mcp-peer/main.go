// Command mcp-peer serves a bare go-sdk MCP server with one local tool
// (set_volume) on /mcp: the baseline of the upstream hop comparison in
// docs/performance.md.
//
//	go run ./cmd/mcp-peer --listen 127.0.0.1:18090
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/devicebridge/devicebridge/internal/peer"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:18090", "address to serve /mcp on")
	flag.Parse()
	mux := http.NewServeMux()
	mux.Handle("/mcp", peer.Handler())
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(os.Stderr, "mcp-peer: serving http://%s/mcp\n", *listen)
	if err := srv.ListenAndServe(); err != nil {
		fmt.Fprintln(os.Stderr, "mcp-peer:", err)
		os.Exit(1)
	}
}
