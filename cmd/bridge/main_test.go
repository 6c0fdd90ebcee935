package main

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestSecondSignalExitsAtOnce: the first signal starts the shutdown, the
// second exits without waiting for it (before, the second was ignored).
func TestSecondSignalExitsAtOnce(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	shutdown := make(chan struct{})
	exited := make(chan int, 1)
	go watchSignals(sigs, func() { close(shutdown) }, zap.NewNop(), func(code int) { exited <- code })

	sigs <- os.Interrupt
	select {
	case <-shutdown:
	case <-time.After(10 * time.Second):
		t.Fatal("the first signal did not start the shutdown")
	}
	require.Empty(t, exited, "the first signal must not exit")
	sigs <- syscall.SIGTERM
	select {
	case code := <-exited:
		require.Equal(t, 130, code)
	case <-time.After(10 * time.Second):
		t.Fatal("the second signal did not exit")
	}
}
