package simulator

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/devicebridge/devicebridge/configs"
)

// Profile describes one kind of board: its identity as reported on the
// wire, its display and font, its initial state and the MCP tools it
// registers, in registration order. A Profile is read-only once loaded and
// may be shared by many boards.
type Profile struct {
	// Name is the profile's own name (the embedded name or the file's base
	// name unless the YAML sets one).
	Name string
	// Board is the firmware's BOARD_NAME, e.g. "bread-compact-wifi". It is
	// the MCP serverInfo name and part of the system information.
	Board string
	// BoardType is BOARD_TYPE in the system information; it defaults to
	// Board.
	BoardType string
	// Firmware is the application version, e.g. "2.4.2".
	Firmware string
	// Language is the firmware's language code, e.g. "zh-CN".
	Language string
	// ChipModel is the chip name in the system information, e.g. "esp32s3".
	ChipModel string
	// Display is nil for boards without a screen.
	Display *Display
	// Font is announced as text_font in the device hello.
	Font Font
	// GlyphPush is the hello's features.glyph_push; text_font is only sent
	// when it is true.
	GlyphPush bool
	// Themes are the names self.screen.set_theme accepts.
	Themes []string
	// State is the initial board state, flattened to dotted keys such as
	// "audio_speaker.volume". Values are bool, int, float64 or string.
	State map[string]any
	// Tools in registration order: AI-visible tools first, user-only last,
	// as the firmware registers them.
	Tools []Tool
}

// Display is a board's screen.
type Display struct {
	Width      int  `yaml:"width"`
	Height     int  `yaml:"height"`
	Monochrome bool `yaml:"monochrome"`
}

// Font is the built-in font a board announces in its hello.
type Font struct {
	Size    int    `yaml:"size"`
	BPP     int    `yaml:"bpp"`
	Charset string `yaml:"charset"`
}

// PropertyType is one of the three argument types the firmware knows.
type PropertyType string

// The property types of the firmware's MCP server; there are no others (no
// numbers with fractions, no arrays, no enums).
const (
	TypeBoolean PropertyType = "boolean"
	TypeInteger PropertyType = "integer"
	TypeString  PropertyType = "string"
)

// Property is one declared tool argument.
type Property struct {
	Name string
	Type PropertyType
	// Default is nil when the property has no default (it is then listed
	// in "required"); otherwise a bool, int or string matching Type.
	Default any
	// Min and Max are set together, only for integers.
	Min, Max *int
}

// HasDefault reports whether the property has a default value.
func (p Property) HasDefault() bool { return p.Default != nil }

// Behavior names what a simulated tool does when called. See the package
// documentation for the vocabulary.
type Behavior string

// Built-in behaviours for tools whose firmware implementation is known, and
// generic ones for anything else.
const (
	BehaviorDeviceStatus    Behavior = "device_status"
	BehaviorSetVolume       Behavior = "set_volume"
	BehaviorSetBrightness   Behavior = "set_brightness"
	BehaviorSetTheme        Behavior = "set_theme"
	BehaviorLampState       Behavior = "lamp_state"
	BehaviorLampOn          Behavior = "lamp_on"
	BehaviorLampOff         Behavior = "lamp_off"
	BehaviorBatteryLevel    Behavior = "battery_level"
	BehaviorSystemInfo      Behavior = "system_info"
	BehaviorScreenInfo      Behavior = "screen_info"
	BehaviorReboot          Behavior = "reboot"
	BehaviorUpgradeFirmware Behavior = "upgrade_firmware"
	BehaviorSet             Behavior = "set"
	BehaviorGet             Behavior = "get"
	BehaviorConst           Behavior = "const"
	BehaviorFail            Behavior = "fail"
	BehaviorContent         Behavior = "content"
	BehaviorEcho            Behavior = "echo"
	BehaviorFormat          Behavior = "format"
	BehaviorSleep           Behavior = "sleep"
)

// MaxSleep bounds what a sleep tool waits, whatever its argument says.
const MaxSleep = 300 * time.Second

// Tool is one MCP tool of a board.
type Tool struct {
	Name        string
	Description string
	Properties  []Property
	// UserOnly tools carry annotations.audience ["user"] and are listed only
	// when tools/list asks for them with withUserTools:true.
	UserOnly bool
	Behavior Behavior
	// Key is the state key for get, or the key prefix for set.
	Key string
	// Text is the result of const or sleep, or the error message of fail.
	Text string
	// InputSchema, when set, is the tool's whole inputSchema (compact
	// JSON), listed as written instead of one built from Properties: what
	// a board beyond the stock firmware can declare (numbers, enums,
	// arrays, $defs). The board then checks only that the schema's
	// required arguments are present, and passes the arguments on as
	// they came.
	InputSchema json.RawMessage
	// Result is the whole tools/call result (compact JSON) of a content
	// tool: any content MCP allows, structuredContent, isError.
	Result json.RawMessage
}

// Required lists the properties without a default, in declaration order,
// which is what the firmware puts in inputSchema.required; for a tool with
// an InputSchema, the schema's own required list.
func (t Tool) Required() []string {
	if t.InputSchema != nil {
		var s struct {
			Required []string `json:"required"`
		}
		_ = json.Unmarshal(t.InputSchema, &s) // checked at load
		return s.Required
	}
	var req []string
	for _, p := range t.Properties {
		if !p.HasDefault() {
			req = append(req, p.Name)
		}
	}
	return req
}

// Defaults applied when a profile leaves a field out.
const (
	defaultFirmware  = "2.4.2"
	defaultLanguage  = "zh-CN"
	defaultChipModel = "esp32s3"
	defaultFontSize  = 14
	defaultFontBPP   = 1
	defaultCharset   = "basic"
)

var (
	// boardNameRE is the character set the firmware's build enforces for
	// BOARD_NAME. It also keeps the name safe inside the replies the
	// firmware builds by string concatenation.
	boardNameRE = regexp.MustCompile(`^[a-z0-9.-]+$`)
	// versionRE keeps the version safe for the same concatenated replies.
	versionRE = regexp.MustCompile(`^[0-9A-Za-z.+_-]+$`)
	// languageRE matches codes like zh-CN or en-US.
	languageRE = regexp.MustCompile(`^[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8})*$`)
)

// LoadProfile loads a board profile. A bare name such as "breadboard",
// "catalog" or "robot" selects a profile embedded from package configs;
// anything containing a path separator or a dot is read as a YAML file.
func LoadProfile(nameOrPath string) (*Profile, error) {
	if nameOrPath != "" && !strings.ContainsAny(nameOrPath, `/\.`) {
		data, err := configs.Profile(nameOrPath)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("simulator: unknown profile %q (embedded profiles: %s; give a path to load a file)",
				nameOrPath, strings.Join(configs.ProfileNames(), ", "))
		}
		if err != nil {
			return nil, err
		}
		return ParseProfile(data, nameOrPath)
	}
	data, err := os.ReadFile(nameOrPath)
	if err != nil {
		return nil, fmt.Errorf("simulator: read profile: %w", err)
	}
	base := strings.TrimSuffix(filepath.Base(nameOrPath), filepath.Ext(nameOrPath))
	return ParseProfile(data, base)
}

// ParseProfile parses and validates a profile from YAML. name is used when
// the document has no name of its own. Unknown fields are errors, so a
// typo does not silently change a board.
func ParseProfile(data []byte, name string) (*Profile, error) {
	var raw rawProfile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("simulator: profile %q: %w", name, err)
	}
	p, err := raw.build(name)
	if err != nil {
		return nil, fmt.Errorf("simulator: profile %q: %w", name, err)
	}
	return p, nil
}

// rawProfile is the YAML shape of a profile before validation.
type rawProfile struct {
	Name      string    `yaml:"name"`
	Board     string    `yaml:"board"`
	BoardType string    `yaml:"board_type"`
	Firmware  string    `yaml:"firmware"`
	Language  string    `yaml:"language"`
	ChipModel string    `yaml:"chip_model"`
	Display   *Display  `yaml:"display"`
	Font      *Font     `yaml:"font"`
	GlyphPush *bool     `yaml:"glyph_push"`
	Themes    []string  `yaml:"themes"`
	State     yaml.Node `yaml:"state"`
	Tools     []rawTool `yaml:"tools"`
}

type rawTool struct {
	Name        string        `yaml:"name"`
	Description string        `yaml:"description"`
	Properties  []rawProperty `yaml:"properties"`
	UserOnly    bool          `yaml:"user_only"`
	Behavior    string        `yaml:"behavior"`
	Key         string        `yaml:"key"`
	Text        string        `yaml:"text"`
	InputSchema yaml.Node     `yaml:"input_schema"`
	Result      yaml.Node     `yaml:"result"`
}

type rawProperty struct {
	Name    string    `yaml:"name"`
	Type    string    `yaml:"type"`
	Default yaml.Node `yaml:"default"`
	Min     *int64    `yaml:"min"`
	Max     *int64    `yaml:"max"`
}

func (r *rawProfile) build(name string) (*Profile, error) {
	p := &Profile{
		Name:      cmp.Or(r.Name, name),
		Board:     r.Board,
		BoardType: cmp.Or(r.BoardType, r.Board),
		Firmware:  cmp.Or(r.Firmware, defaultFirmware),
		Language:  cmp.Or(r.Language, defaultLanguage),
		ChipModel: cmp.Or(r.ChipModel, defaultChipModel),
		Display:   r.Display,
		Font:      Font{Size: defaultFontSize, BPP: defaultFontBPP, Charset: defaultCharset},
		GlyphPush: r.GlyphPush == nil || *r.GlyphPush,
		Themes:    r.Themes,
		State:     map[string]any{},
	}
	if r.Font != nil {
		p.Font = Font{
			Size:    cmp.Or(r.Font.Size, defaultFontSize),
			BPP:     cmp.Or(r.Font.BPP, defaultFontBPP),
			Charset: cmp.Or(r.Font.Charset, defaultCharset),
		}
	}

	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if !boardNameRE.MatchString(p.Board) {
		fail("board %q: must be non-empty and use only a-z, 0-9, '.' and '-'", p.Board)
	}
	if r.BoardType != "" && !boardNameRE.MatchString(p.BoardType) {
		fail("board_type %q: must use only a-z, 0-9, '.' and '-'", p.BoardType)
	}
	if !versionRE.MatchString(p.Firmware) {
		fail("firmware %q: must be a plain version such as 2.4.2", p.Firmware)
	}
	if !languageRE.MatchString(p.Language) {
		fail("language %q: must be a code such as zh-CN", p.Language)
	}
	if !boardNameRE.MatchString(p.ChipModel) {
		fail("chip_model %q: must use only a-z, 0-9, '.' and '-'", p.ChipModel)
	}
	if d := p.Display; d != nil && (d.Width <= 0 || d.Height <= 0) {
		fail("display: width and height must be positive, got %dx%d", d.Width, d.Height)
	}
	if p.Font.Size <= 0 || p.Font.BPP <= 0 || !boardNameRE.MatchString(p.Font.Charset) {
		fail("font: size and bpp must be positive and charset a plain word")
	}
	for _, th := range p.Themes {
		if th == "" {
			fail("themes: empty theme name")
		}
	}

	if !r.State.IsZero() {
		if err := flattenState(&r.State, "", p.State); err != nil {
			fail("state: %v", err)
		}
	}

	seen := map[string]bool{}
	for i, rt := range r.Tools {
		t, err := rt.build(p)
		where := fmt.Sprintf("tools[%d]", i)
		if rt.Name != "" {
			where += " (" + rt.Name + ")"
		}
		if err != nil {
			fail("%s: %v", where, err)
			continue
		}
		if seen[t.Name] {
			fail("%s: duplicate tool name", where)
			continue
		}
		seen[t.Name] = true
		p.Tools = append(p.Tools, t)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return p, nil
}

// flattenState turns nested YAML mappings into dotted keys. Only scalar
// leaves are allowed, because the tools that read state render scalars.
func flattenState(n *yaml.Node, prefix string, out map[string]any) error {
	if n.Kind != yaml.MappingNode {
		return fmt.Errorf("%s: must be a mapping", cmp.Or(prefix, "state"))
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i].Value, n.Content[i+1]
		if k == "" || strings.Contains(k, ".") {
			return fmt.Errorf("%s: key %q must be non-empty and contain no dots (nest mappings instead)", cmp.Or(prefix, "state"), k)
		}
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		if v.Kind == yaml.MappingNode {
			if err := flattenState(v, key, out); err != nil {
				return err
			}
			continue
		}
		if v.Kind != yaml.ScalarNode {
			return fmt.Errorf("%s: only scalars and mappings are allowed", key)
		}
		var val any
		switch v.Tag {
		case "!!bool":
			var b bool
			if err := v.Decode(&b); err != nil {
				return fmt.Errorf("%s: %v", key, err)
			}
			val = b
		case "!!int":
			var x int
			if err := v.Decode(&x); err != nil {
				return fmt.Errorf("%s: %v", key, err)
			}
			val = x
		case "!!float":
			var f float64
			if err := v.Decode(&f); err != nil {
				return fmt.Errorf("%s: %v", key, err)
			}
			val = f
		case "!!str":
			val = v.Value
		default:
			return fmt.Errorf("%s: unsupported value %q (use a bool, number or string)", key, v.Value)
		}
		if _, dup := out[key]; dup {
			return fmt.Errorf("%s: duplicate key", key)
		}
		out[key] = val
	}
	return nil
}

func (rt *rawTool) build(p *Profile) (Tool, error) {
	t := Tool{
		Name:        rt.Name,
		Description: rt.Description,
		UserOnly:    rt.UserOnly,
		Behavior:    Behavior(rt.Behavior),
		Key:         rt.Key,
		Text:        rt.Text,
	}
	// Names travel unescaped in nextCursor and error messages, so quotes,
	// backslashes and control characters would break the board's replies.
	if t.Name == "" || strings.ContainsAny(t.Name, "\"\\") || strings.IndexFunc(t.Name, func(r rune) bool { return r < 0x20 }) >= 0 {
		return t, errors.New("name must be non-empty and contain no quotes, backslashes or control characters")
	}
	if !rt.InputSchema.IsZero() {
		if len(rt.Properties) > 0 {
			return t, errors.New("give either properties or input_schema, not both")
		}
		schema, err := inputSchemaJSON(&rt.InputSchema)
		if err != nil {
			return t, fmt.Errorf("input_schema: %v", err)
		}
		t.InputSchema = schema
	}
	if !rt.Result.IsZero() {
		res, err := resultJSON(&rt.Result)
		if err != nil {
			return t, fmt.Errorf("result: %v", err)
		}
		t.Result = res
	}
	seen := map[string]bool{}
	for i, rp := range rt.Properties {
		prop, err := rp.build()
		if err != nil {
			return t, fmt.Errorf("properties[%d] (%s): %v", i, rp.Name, err)
		}
		if seen[prop.Name] {
			return t, fmt.Errorf("properties[%d]: duplicate property name %q", i, prop.Name)
		}
		seen[prop.Name] = true
		t.Properties = append(t.Properties, prop)
	}
	if err := t.checkBehavior(p); err != nil {
		return t, err
	}
	if t.Behavior == BehaviorSet && t.Key == "" {
		t.Key = strings.TrimPrefix(t.Name, "self.")
	}
	// A schema given whole is meant to be listed: refuse one whose tool
	// cannot fit a tools/list page alone (the firmware would answer
	// "payload size limit"; profiles that want that use a long
	// description).
	if n := len(renderTool(&t)); t.InputSchema != nil && n+len(`{"tools":[]}`)+toolsPageMargin > toolsPageLimit {
		return t, fmt.Errorf("the tool takes %d bytes in tools/list, more than a page holds (%d)", n, toolsPageLimit-toolsPageMargin)
	}
	return t, nil
}

func (rp *rawProperty) build() (Property, error) {
	prop := Property{Name: rp.Name, Type: PropertyType(rp.Type)}
	if prop.Name == "" || strings.IndexFunc(prop.Name, func(r rune) bool { return r < 0x20 }) >= 0 {
		return prop, errors.New("name must be non-empty and contain no control characters")
	}
	switch prop.Type {
	case TypeBoolean, TypeInteger, TypeString:
	default:
		return prop, fmt.Errorf("type %q: must be boolean, integer or string", rp.Type)
	}
	if (rp.Min == nil) != (rp.Max == nil) {
		return prop, errors.New("an integer range needs both min and max")
	}
	if rp.Min != nil {
		if prop.Type != TypeInteger {
			return prop, errors.New("min and max are only allowed on integer properties")
		}
		if !fitsInt32(*rp.Min) || !fitsInt32(*rp.Max) {
			return prop, errors.New("min and max must fit in 32 bits, like the firmware's int")
		}
		if *rp.Min > *rp.Max {
			return prop, fmt.Errorf("min %d is greater than max %d", *rp.Min, *rp.Max)
		}
		lo, hi := int(*rp.Min), int(*rp.Max)
		prop.Min, prop.Max = &lo, &hi
	}
	if !rp.Default.IsZero() {
		d := &rp.Default
		if d.Kind != yaml.ScalarNode {
			return prop, errors.New("default must be a scalar")
		}
		switch prop.Type {
		case TypeBoolean:
			var b bool
			if d.Tag != "!!bool" || d.Decode(&b) != nil {
				return prop, fmt.Errorf("default %q is not a boolean", d.Value)
			}
			prop.Default = b
		case TypeInteger:
			var x int64
			if d.Tag != "!!int" || d.Decode(&x) != nil || !fitsInt32(x) {
				return prop, fmt.Errorf("default %q is not a 32-bit integer", d.Value)
			}
			if prop.Min != nil && (int(x) < *prop.Min || int(x) > *prop.Max) {
				return prop, fmt.Errorf("default %d is outside the range %d..%d", x, *prop.Min, *prop.Max)
			}
			prop.Default = int(x)
		case TypeString:
			if d.Tag != "!!str" {
				return prop, fmt.Errorf("default %q is not a string (quote it)", d.Value)
			}
			prop.Default = d.Value
		}
	}
	return prop, nil
}

func fitsInt32(x int64) bool { return x >= math.MinInt32 && x <= math.MaxInt32 }

// checkBehavior makes sure a tool's behaviour has what it needs, so that a
// profile mistake shows up at load time and not as an odd reply.
func (t *Tool) checkBehavior(p *Profile) error {
	needProp := func(name string, typ PropertyType) error {
		for _, prop := range t.Properties {
			if prop.Name == name && prop.Type == typ {
				return nil
			}
		}
		return fmt.Errorf("behavior %s needs a %s property %q", t.Behavior, typ, name)
	}
	needState := func(key string) error {
		if _, ok := p.State[key]; !ok {
			return fmt.Errorf("behavior %s needs state key %q", t.Behavior, key)
		}
		return nil
	}
	if t.Key != "" && t.Behavior != BehaviorSet && t.Behavior != BehaviorGet {
		return fmt.Errorf("key is only used by the set and get behaviors")
	}
	if t.Text != "" && t.Behavior != BehaviorConst && t.Behavior != BehaviorFail && t.Behavior != BehaviorSleep &&
		t.Behavior != BehaviorFormat {
		return fmt.Errorf("text is only used by the const, fail, sleep and format behaviors")
	}
	if t.Behavior == BehaviorFormat && t.Text == "" {
		return fmt.Errorf("behavior format needs a text (its {name} placeholders take the arguments)")
	}
	if (t.Result != nil) != (t.Behavior == BehaviorContent) {
		return fmt.Errorf("behavior content needs a result, and result is only used by it")
	}
	if t.InputSchema != nil {
		switch t.Behavior {
		case BehaviorConst, BehaviorFail, BehaviorContent, BehaviorEcho:
		default:
			return fmt.Errorf("input_schema only goes with the const, fail, content and echo behaviors (behavior %s reads firmware properties)", t.Behavior)
		}
	}
	switch t.Behavior {
	case BehaviorDeviceStatus, BehaviorLampState, BehaviorLampOn, BehaviorLampOff,
		BehaviorSystemInfo, BehaviorReboot, BehaviorSet, BehaviorConst, BehaviorContent, BehaviorEcho, BehaviorFormat:
		return nil
	case BehaviorSetVolume:
		return needProp("volume", TypeInteger)
	case BehaviorSleep:
		if err := needProp("seconds", TypeInteger); err != nil {
			return err
		}
		for _, prop := range t.Properties {
			if prop.Name == "seconds" && prop.Max != nil && time.Duration(*prop.Max)*time.Second > MaxSleep {
				return fmt.Errorf("behavior sleep waits at most %d seconds; give seconds a max of at most that", int(MaxSleep/time.Second))
			}
		}
		return nil
	case BehaviorSetBrightness:
		if err := needProp("brightness", TypeInteger); err != nil {
			return err
		}
		// Brightness only shows in the device status of boards with a
		// backlight; the state key stands for that backlight.
		return needState(stateBrightness)
	case BehaviorSetTheme:
		if len(p.Themes) == 0 || p.Display == nil {
			return fmt.Errorf("behavior %s needs a display and a themes list", t.Behavior)
		}
		return needProp("theme", TypeString)
	case BehaviorBatteryLevel:
		return needState(stateBatteryLevel)
	case BehaviorScreenInfo:
		if p.Display == nil {
			return fmt.Errorf("behavior %s needs a display", t.Behavior)
		}
		return nil
	case BehaviorUpgradeFirmware:
		return needProp("url", TypeString)
	case BehaviorGet:
		if t.Key == "" {
			return errors.New("behavior get needs a key")
		}
		return needState(t.Key)
	case BehaviorFail:
		if t.Text == "" {
			return errors.New("behavior fail needs a text (the error message)")
		}
		return nil
	case "":
		return fmt.Errorf("behavior is missing (one of %s)", strings.Join(behaviorNames(), ", "))
	default:
		return fmt.Errorf("unknown behavior %q (one of %s)", t.Behavior, strings.Join(behaviorNames(), ", "))
	}
}

func behaviorNames() []string {
	names := []string{
		string(BehaviorDeviceStatus), string(BehaviorSetVolume), string(BehaviorSetBrightness),
		string(BehaviorSetTheme), string(BehaviorLampState), string(BehaviorLampOn), string(BehaviorLampOff),
		string(BehaviorBatteryLevel), string(BehaviorSystemInfo), string(BehaviorScreenInfo),
		string(BehaviorReboot), string(BehaviorUpgradeFirmware), string(BehaviorSet), string(BehaviorGet),
		string(BehaviorConst), string(BehaviorFail), string(BehaviorContent), string(BehaviorEcho),
		string(BehaviorFormat), string(BehaviorSleep),
	}
	sort.Strings(names)
	return names
}
