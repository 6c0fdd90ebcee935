// Package console is the bridge's web console: plain HTML, CSS and
// JavaScript embedded in the binary and served on the control listener at
// "/" (assets under /console/). It needs nothing from the internet. The
// files hold no fleet data: everything the page shows it reads from the
// control API (/api/devices, /api/events, /api/stats/recent,
// /api/interactions, /api/ota/devices) with
// the bearer token the user typed, so the console is exactly as protected
// as the API.
package console

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed web
var files embed.FS

// Handler serves the console: "/" is the page, /console/<file> its assets.
func Handler() http.Handler {
	web, err := fs.Sub(files, "web")
	if err != nil {
		panic(err) // the embedded tree always has web/
	}
	assets := http.StripPrefix("/console/", http.FileServer(http.FS(web)))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Board data (tool names, descriptions, results) is untrusted: the
		// page renders it as text, and the policy forbids any script,
		// style or connection that is not the bridge's own.
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		if r.URL.Path == "/" {
			http.ServeFileFS(w, r, web, "index.html")
			return
		}
		if strings.HasSuffix(r.URL.Path, "/") { // no directory listings
			http.NotFound(w, r)
			return
		}
		assets.ServeHTTP(w, r)
	})
}
