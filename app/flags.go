package app

// This file turns the flag package's errors into one line that says what
// the flag wants ("--call-timeout: "5" is not a duration; use a duration
// like 5s"), instead of its terse message followed by the whole usage
// text, which pushed the error off the screen. --help still prints the
// usage.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/devicebridge/devicebridge/internal/editdist"
)

// parseFlags parses args into fs and returns an error of one line that
// names the flag and what it expects. On --help it prints the full usage
// to stderr and returns flag.ErrHelp.
func parseFlags(fs *flag.FlagSet, args []string) error {
	var failed *flagFailure
	restore := wrapFlagValues(fs, &failed)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	restore()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(os.Stderr)
		fmt.Fprintf(os.Stderr, "Usage of %s:\n", fs.Name())
		fs.PrintDefaults()
		return err
	case failed != nil:
		return failed.explain()
	}
	return explainFlagError(fs, err)
}

// flagFailure is a value a flag refused.
type flagFailure struct {
	name, value string
	// before is the flag's value before the refused one (the flag
	// package stores a number it could not parse as 0 or its limit).
	before string
	orig   flag.Value
	err    error
}

// checkedValue wraps a flag's value to record what it refused;
// checkedBool keeps a boolean flag usable without a value (--ota).
type checkedValue struct {
	flag.Value
	name   string
	failed **flagFailure
}

func (v checkedValue) Set(s string) error {
	before := v.Value.String()
	err := v.Value.Set(s)
	if err != nil && *v.failed == nil {
		*v.failed = &flagFailure{name: v.name, value: s, before: before, orig: v.Value, err: err}
	}
	return err
}

type checkedBool struct{ checkedValue }

func (checkedBool) IsBoolFlag() bool { return true }

// wrapFlagValues wraps every flag of fs for the length of one parse; the
// returned function puts the originals back (the usage text reads their
// types).
func wrapFlagValues(fs *flag.FlagSet, failed **flagFailure) (restore func()) {
	orig := map[*flag.Flag]flag.Value{}
	fs.VisitAll(func(f *flag.Flag) {
		orig[f] = f.Value
		cv := checkedValue{Value: f.Value, name: f.Name, failed: failed}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			f.Value = checkedBool{cv}
		} else {
			f.Value = cv
		}
	})
	return func() {
		for f, v := range orig {
			f.Value = v
		}
	}
}

// explain says what the flag expects, by the type of its value.
func (f *flagFailure) explain() error {
	name := "--" + f.name
	var kind any
	if g, ok := f.orig.(flag.Getter); ok {
		kind = g.Get()
	}
	// The flag package says "value out of range" for strconv.ErrRange.
	outOfRange := errors.Is(f.err, strconv.ErrRange) || strings.Contains(f.err.Error(), "out of range")
	switch kind.(type) {
	case time.Duration:
		return fmt.Errorf("%s: %q is not a duration; use a duration like 5s, 500ms or 2m", name, f.value)
	case int, int64, uint, uint64:
		if outOfRange {
			return fmt.Errorf("%s: %q is out of range; use a whole number like %s", name, f.value, example(f.before, "3"))
		}
		return fmt.Errorf("%s: %q is not a whole number; use a whole number like %s", name, f.value, example(f.before, "3"))
	case float64:
		if outOfRange {
			return fmt.Errorf("%s: %q is out of range", name, f.value)
		}
		return fmt.Errorf("%s: %q is not a number; use a number like %s", name, f.value, example(f.before, "2.5"))
	case bool:
		return fmt.Errorf("%s: %q is not true or false; write %s, %s=true or %s=false", name, f.value, name, name, name)
	}
	return fmt.Errorf("%s: %q: %w", name, f.value, f.err)
}

// example is a flag's value s when it makes a good example, else def.
func example(s, def string) string {
	if s != "" && s != "0" {
		return s
	}
	return def
}

// explainFlagError rewrites the flag package's own errors (an unknown
// flag, a missing value).
func explainFlagError(fs *flag.FlagSet, err error) error {
	msg := err.Error()
	help := fmt.Sprintf("'%s --help' lists every flag", fs.Name())
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		name = strings.TrimLeft(name, "-")
		if s := closestFlag(fs, name); s != "" {
			return fmt.Errorf("unknown flag --%s; did you mean --%s? (%s)", name, s, help)
		}
		return fmt.Errorf("unknown flag --%s (%s)", name, help)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		name = strings.TrimLeft(name, "-")
		if f := fs.Lookup(name); f != nil {
			return fmt.Errorf("--%s needs a value: --%s %s", name, name, valueHint(f.Value))
		}
		return fmt.Errorf("--%s needs a value", name)
	}
	return fmt.Errorf("%s (%s)", msg, help)
}

// valueHint is an example value for a flag, by its type.
func valueHint(v flag.Value) string {
	g, ok := v.(flag.Getter)
	if !ok {
		return "VALUE"
	}
	switch g.Get().(type) {
	case time.Duration:
		return "5s"
	case int, int64, uint, uint64:
		return example(v.String(), "3")
	case float64:
		return example(v.String(), "2.5")
	}
	return "VALUE"
}

// closestFlag is the flag name nearest to name (a typo, or a word of a
// longer name), or "" when none is near enough.
func closestFlag(fs *flag.FlagSet, name string) string {
	best, bestDist := "", -1
	var containing []string
	fs.VisitAll(func(f *flag.Flag) {
		d := editdist.Distance(name, f.Name)
		if bestDist < 0 || d < bestDist {
			best, bestDist = f.Name, d
		}
		if len(name) >= 3 && strings.Contains(f.Name, name) {
			containing = append(containing, f.Name)
		}
	})
	if bestDist >= 0 && bestDist <= max(2, len(name)/3) {
		return best
	}
	if len(containing) == 1 {
		return containing[0]
	}
	return ""
}
