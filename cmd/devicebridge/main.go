// Command devicebridge is the bridge's command-line client: it lists the
// boards, shows one, calls a tool with arguments typed from its schema,
// follows the event stream, and runs a call interactively, asking for what
// is missing. It talks to the control API (DEVICEBRIDGE_URL or --bridge,
// token in DEVICEBRIDGE_TOKEN). README "Command line" documents it.
//
// Exit codes: 0 done; 1 the call failed or the tool reported an error;
// 2 usage; 3 no such board or tool; 4 arguments refused; 5 the bridge is
// unreachable (or the URL is not its control listener) or refused the
// token; 6 not run (declined or cancelled at a prompt); 130 interrupted.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Exit codes.
const (
	exitOK          = 0
	exitFailed      = 1
	exitUsage       = 2
	exitNotFound    = 3
	exitInvalidArgs = 4
	exitUnreachable = 5
	exitNotRun      = 6
	exitInterrupted = 130
)

const usage = `devicebridge: see and drive the boards of a devicebridge bridge

usage: devicebridge [--bridge URL] [--json] <command> [arguments]

commands:
  devices                           every board: MAC, alias, transport, state, firmware, tools
  show <board>                      one board: identity and tools
  tools <board>                     a board's tools in device order, with their arguments
  call <board> <tool> [key=value]…  call a tool; values are typed from its schema
                                    (key:=JSON passes raw JSON)
  watch                             follow boards and calls as they happen
  interact <board> <tool> [k=v]…    call a tool, asked for each missing argument and for
                                    confirmation of dangerous tools
  approvals                         boards waiting for approval at the OTA endpoint (--ota-approval),
                                    with their activation codes, and every other board it knows
  approve <code|mac>                admit a waiting board by the code on its screen or its MAC

<board> is a MAC (02:00:00:00:00:01), its last digits (01, 00:01) or an alias.
<tool> is the board's tool name; the "self." prefix may be left out.

flags (anywhere on the line):
  --bridge URL   the bridge's control listener (default $DEVICEBRIDGE_URL, else http://127.0.0.1:8080)
  --json         print JSON for scripts
The bearer token, when the bridge needs one, is read from $DEVICEBRIDGE_TOKEN.

exit codes: 0 done, 1 call failed, 2 usage, 3 no such board or tool, 4 arguments refused,
            5 bridge unreachable (or not a control listener) or token refused,
            6 not run (declined), 130 interrupted
`

// commands are the command names, as usage lists them.
var commands = []string{"devices", "show", "tools", "call", "watch", "interact", "approvals", "approve"}

// cli is one invocation: its streams, environment and options.
type cli struct {
	stdin io.Reader
	// stdout and stderr escape what boards send (see screen).
	stdout, stderr *screen
	bridge, token  string
	json           bool
	// stderrTTY says whether stderr is a terminal (progress indicator).
	stderrTTY bool
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c := &cli{stdin: os.Stdin, stdout: newScreen(os.Stdout), stderr: newScreen(os.Stderr), stderrTTY: isTerminal(os.Stderr)}
	code := c.run(ctx, os.Args[1:], os.Getenv)
	if ctx.Err() != nil && code != exitOK {
		code = exitInterrupted
	}
	os.Exit(code)
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// usageError is a mistake on the command line.
type usageError string

func (e usageError) Error() string { return string(e) }

func (c *cli) run(ctx context.Context, args []string, getenv func(string) string) int {
	c.bridge = getenv("DEVICEBRIDGE_URL")
	if c.bridge == "" {
		c.bridge = defaultBridge
	}
	c.token = getenv("DEVICEBRIDGE_TOKEN")
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			pos = append(pos, args[i+1:]...)
			i = len(args)
		case a == "--json" || a == "-json":
			c.json = true
		case a == "--bridge" || a == "-bridge":
			if i+1 >= len(args) {
				return c.fail(usageError("--bridge needs a URL, e.g. --bridge http://127.0.0.1:8080"))
			}
			i++
			c.bridge = args[i]
		case strings.HasPrefix(a, "--bridge="):
			c.bridge = strings.TrimPrefix(a, "--bridge=")
		case a == "-h" || a == "--help" || a == "help":
			c.stdout.printf("%s", shown(usage))
			return exitOK
		case strings.HasPrefix(a, "-") && len(a) > 1 && !strings.Contains(a, "="):
			return c.fail(usageError(fmt.Sprintf("unknown flag %s (devicebridge --help lists them)", a)))
		default:
			pos = append(pos, a)
		}
	}
	c.bridge = strings.TrimRight(c.bridge, "/")
	if !strings.Contains(c.bridge, "://") {
		c.bridge = "http://" + c.bridge
	}
	if len(pos) == 0 {
		c.stderr.printf("%s", shown(usage))
		return exitUsage
	}
	cmd, rest := pos[0], pos[1:]
	// nargs checks the number of arguments: at least least, at most most
	// (-1: any number).
	nargs := func(least, most int, form string) error {
		switch {
		case len(rest) < least:
			return usageError("usage: devicebridge " + form)
		case most >= 0 && len(rest) > most:
			return usageError(fmt.Sprintf("%s: unexpected argument %q (usage: devicebridge %s)", cmd, rest[most], form))
		}
		return nil
	}
	var err error
	switch cmd {
	case "devices", "ls", "list":
		if err = nargs(0, 0, "devices"); err == nil {
			err = c.devices(ctx)
		}
	case "show":
		if err = nargs(1, 1, "show <board>"); err == nil {
			err = c.show(ctx, rest[0])
		}
	case "tools":
		if err = nargs(1, 1, "tools <board>"); err == nil {
			err = c.tools(ctx, rest[0])
		}
	case "call":
		if err = nargs(2, -1, "call <board> <tool> [key=value]…"); err == nil {
			err = c.call(ctx, rest[0], rest[1], rest[2:])
		}
	case "watch":
		if err = nargs(0, 0, "watch"); err == nil {
			err = c.watch(ctx)
		}
	case "interact":
		if err = nargs(2, -1, "interact <board> <tool> [key=value]…"); err == nil {
			err = c.interact(ctx, rest[0], rest[1], rest[2:])
		}
	case "approvals":
		if err = nargs(0, 0, "approvals"); err == nil {
			err = c.approvals(ctx)
		}
	case "approve":
		if err = nargs(1, 1, "approve <code|mac>"); err == nil {
			err = c.approve(ctx, rest[0])
		}
	default:
		err = usageError(fmt.Sprintf("unknown command %q%s (commands: %s)",
			cmd, didYouMean(cmd, commands), strings.Join(commands, ", ")))
	}
	return c.fail(err)
}

// fail prints err and returns its exit code (exitOK for nil).
func (c *cli) fail(err error) int {
	if err == nil {
		return exitOK
	}
	if e, ok := err.(*exitError); ok && e.silent {
		return e.code
	}
	c.stderr.printf("devicebridge: %s\n", err)
	return codeOf(err)
}

// exitError is an error with its exit code; silent ones were reported.
type exitError struct {
	code   int
	msg    shown
	silent bool
}

func (e *exitError) Error() string { return string(e.msg) }
func (e *exitError) shown() shown  { return e.msg }

// errf formats an exitError like screen.printf: its values are made safe.
func errf(code int, format string, args ...any) error {
	return &exitError{code: code, msg: shown(fmt.Sprintf(format, shownArgs(args)...))}
}
