package app

// This file runs the opt-in debug listener: net/http/pprof on an address of
// its own (debug_listen), loopback only unless debug_allow_remote.

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"

	"go.uber.org/zap"
)

// DebugAddr is the debug listener's bound address, or nil when it is off.
func (a *App) DebugAddr() net.Addr {
	if p := a.obs.debugAddr.Load(); p != nil {
		return *p
	}
	return nil
}

// startDebug serves net/http/pprof on debug_listen, on a mux of its own:
// never on the control or device listener. Profiles in progress end when
// Shutdown starts; the listener closes with the other shutdown steps.
func (a *App) startDebug() error {
	if a.cfg.DebugListen == "" {
		return nil
	}
	ln, err := a.listen("debug", a.cfg.DebugListen, a.cfg.HTTP.ControlMaxConnections, "http.control_max_connections", nil)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	base, cancel := context.WithCancel(context.Background())
	log := a.log.Named("debug")
	srv := a.httpServer(mux, log)
	srv.BaseContext = func(net.Listener) context.Context { return base }
	addr := ln.Addr()
	a.obs.debugAddr.Store(&addr)
	a.onDrain(cancel) // a 30s CPU profile must not hold the shutdown up
	a.onShutdown(func(ctx context.Context) {
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		a.obs.debugAddr.Store(nil)
	})
	a.serve(srv, ln, "debug")
	if isLoopback(a.cfg.DebugListen) {
		log.Info("debug listener serving pprof", zap.String("url", "http://"+addr.String()+"/debug/pprof/"))
	} else {
		log.Warn("debug listener serving pprof beyond loopback (debug_allow_remote): it has no authentication",
			zap.String("listen", addr.String()))
	}
	return nil
}

// validateDebug refuses a debug listener beyond loopback unless
// debug_allow_remote says so: pprof has no authentication and exposes the
// command line, memory contents and CPU time.
func (c Config) validateDebug() error {
	if c.DebugListen == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(c.DebugListen); err != nil {
		return fmt.Errorf("debug_listen %q: want host:port", c.DebugListen)
	}
	if !isLoopback(c.DebugListen) && !c.DebugAllowRemote {
		return fmt.Errorf("debug_listen %q is not a loopback address: pprof has no authentication, so use "+
			"127.0.0.1:PORT or [::1]:PORT, or set debug_allow_remote (--debug-allow-remote) to expose it anyway",
			c.DebugListen)
	}
	return nil
}

// isLoopback: host:port names a loopback address (an empty host means
// every interface, which is not).
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func registerDebugFlags(fs *flag.FlagSet, c *Config) {
	fs.StringVar(&c.DebugListen, "debug-listen", c.DebugListen, `serve pprof on this address (loopback only unless --debug-allow-remote; "" is off)`)
	fs.BoolVar(&c.DebugAllowRemote, "debug-allow-remote", c.DebugAllowRemote, "allow a non-loopback --debug-listen (pprof has no authentication)")
}
