package mcpserver_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/devicebridge/devicebridge/internal/bridgetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The shared harness (internal/bridgetest) under the short names these
// tests use.
const (
	legacy = bridgetest.Legacy
	modern = bridgetest.Modern
)

var (
	eras        = bridgetest.Eras
	startBridge = bridgetest.Start
	toolNames   = bridgetest.ToolNames
	listTools   = bridgetest.ListTools
	callTool    = bridgetest.CallTool
	text        = bridgetest.Text
)

type (
	bridge  = bridgetest.Bridge
	signals = bridgetest.Signals
)
