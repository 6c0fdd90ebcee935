package simulator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"

	"go.uber.org/zap"
)

// State keys the built-in behaviours read and write. Profiles declare them
// as nested YAML mappings (audio_speaker: {volume: 70}).
const (
	stateVolume          = "audio_speaker.volume"
	stateBrightness      = "screen.brightness"
	stateTheme           = "screen.theme"
	stateBatteryLevel    = "battery.level"
	stateBatteryCharging = "battery.charging"
	stateSSID            = "network.ssid"
	stateRSSI            = "network.rssi"
	stateChannel         = "network.channel"
	stateIP              = "network.ip"
	stateChipTemperature = "chip.temperature"
	stateLampPower       = "lamp.power"
)

// Fixed values of the simulated system information; a real board reports
// its build and flash layout here.
const (
	sysFlashSize   = 16777216
	sysMinFreeHeap = "8318916"
	sysCompileTime = "Aug  8 2026T08:33:45Z"
	sysIDFVersion  = "v5.5.2"
	sysChipInfo    = `{"model":9,"cores":2,"revision":2,"features":18}`
	sysPartitions  = `{"label":"nvs","type":1,"subtype":2,"address":36864,"size":16384},` +
		`{"label":"otadata","type":1,"subtype":0,"address":53248,"size":8192},` +
		`{"label":"phy_init","type":1,"subtype":1,"address":61440,"size":4096},` +
		`{"label":"ota_0","type":0,"subtype":16,"address":131072,"size":4128768},` +
		`{"label":"ota_1","type":0,"subtype":17,"address":4259840,"size":4128768}`
)

// runTool executes a tool's behaviour and returns the text of its result,
// or an error whose message becomes the error reply (the firmware's thrown
// exception).
func (s *session) runTool(t *Tool, args []boundArg) (string, error) {
	b := s.b
	arg := func(name string) any {
		for _, a := range args {
			if a.name == name {
				return a.value
			}
		}
		return nil
	}
	switch t.Behavior {
	case BehaviorDeviceStatus:
		return b.deviceStatusJSON(), nil
	case BehaviorSetVolume:
		b.SetState(stateVolume, arg("volume"))
		return "true", nil
	case BehaviorSetBrightness:
		b.SetState(stateBrightness, arg("brightness"))
		return "true", nil
	case BehaviorSetTheme:
		theme, _ := arg("theme").(string)
		for _, known := range b.profile.Themes {
			if known == theme {
				b.SetState(stateTheme, theme)
				return "true", nil
			}
		}
		// An unknown theme is not an error on the firmware, just false.
		return "false", nil
	case BehaviorLampState:
		// The firmware writes this one by hand, space included.
		if on, _ := b.State()[stateLampPower].(bool); on {
			return `{"power": true}`, nil
		}
		return `{"power": false}`, nil
	case BehaviorLampOn:
		b.SetState(stateLampPower, true)
		return "true", nil
	case BehaviorLampOff:
		b.SetState(stateLampPower, false)
		return "true", nil
	case BehaviorBatteryLevel:
		st := b.State()
		level, _ := st[stateBatteryLevel].(int)
		charging, _ := st[stateBatteryCharging].(bool)
		return `{"level":` + strconv.Itoa(level) + `,"charging":` + strconv.FormatBool(charging) + `}`, nil
	case BehaviorSystemInfo:
		return b.SystemInfoJSON(), nil
	case BehaviorScreenInfo:
		d := b.profile.Display
		return `{"width":` + strconv.Itoa(d.Width) + `,"height":` + strconv.Itoa(d.Height) +
			`,"monochrome":` + strconv.FormatBool(d.Monochrome) + `}`, nil
	case BehaviorReboot:
		// The reboot is queued before this call's reply, and the board is
		// gone before the reply's turn comes: self.reboot never answers.
		s.schedule(s.rebootTask())
		return "true", nil
	case BehaviorUpgradeFirmware:
		url, _ := arg("url").(string)
		s.schedule(s.upgradeTask(url))
		return "true", nil
	case BehaviorSet:
		b.mu.Lock()
		for _, a := range args {
			b.state[t.Key+"."+a.name] = a.value
		}
		b.mu.Unlock()
		return "true", nil
	case BehaviorGet:
		return formatStateValue(b.State()[t.Key]), nil
	case BehaviorConst:
		return t.Text, nil
	case BehaviorFail:
		return "", errors.New(t.Text)
	}
	return "", errors.New("unsupported behavior " + string(t.Behavior))
}

// upgradeTask mirrors the firmware's upgrade: it closes the audio channel
// before downloading, so on WebSocket the call's reply is lost. The
// simulator does not download anything; the attempt counts as failed.
func (s *session) upgradeTask(url string) task {
	return func(ctx context.Context) {
		if ctx.Err() != nil {
			return
		}
		s.log.Info("firmware upgrade requested; closing the channel", zap.String("url", url))
		s.link.closeChannel(ErrFirmwareUpgrade)
	}
}

// formatStateValue renders a state value as a tool's text result.
func formatStateValue(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	case int:
		return strconv.Itoa(x)
	case float64:
		return string(appendCJSONNumber(nil, x))
	case nil:
		return ""
	}
	return ""
}

// deviceStatusJSON renders self.get_device_status as the firmware's Wi-Fi
// boards do with cJSON: speaker, screen (brightness with a backlight, theme
// only on displays taller than 64 px), battery and chip when present, and
// the Wi-Fi signal as a word.
func (b *Board) deviceStatusJSON() string {
	st := b.State()
	out := []byte(`{"audio_speaker":{`)
	if v, ok := st[stateVolume].(int); ok {
		out = append(out, `"volume":`...)
		out = strconv.AppendInt(out, int64(v), 10)
	}
	out = append(out, `},"screen":{`...)
	sep := ""
	if v, ok := st[stateBrightness].(int); ok {
		out = append(out, `"brightness":`...)
		out = strconv.AppendInt(out, int64(v), 10)
		sep = ","
	}
	if d := b.profile.Display; d != nil && d.Height > 64 {
		theme, _ := st[stateTheme].(string)
		out = append(out, sep+`"theme":`...)
		out = appendCJSONString(out, theme)
	}
	out = append(out, '}')
	if level, ok := st[stateBatteryLevel].(int); ok {
		charging, _ := st[stateBatteryCharging].(bool)
		out = append(out, `,"battery":{"level":`...)
		out = strconv.AppendInt(out, int64(level), 10)
		out = append(out, `,"charging":`...)
		out = strconv.AppendBool(out, charging)
		out = append(out, '}')
	}
	ssid, _ := st[stateSSID].(string)
	out = append(out, `,"network":{"type":"wifi","ssid":`...)
	out = appendCJSONString(out, ssid)
	out = append(out, `,"signal":"`...)
	out = append(out, signalWord(intState(st, stateRSSI))...)
	out = append(out, `"}`...)
	if t, ok := numberState(st, stateChipTemperature); ok {
		// The firmware holds the temperature in a float, so print what a
		// float widened to double looks like.
		out = append(out, `,"chip":{"temperature":`...)
		out = appendCJSONNumber(out, float64(float32(t)))
		out = append(out, '}')
	}
	return string(append(out, '}'))
}

func signalWord(rssi int) string {
	switch {
	case rssi >= -60:
		return "strong"
	case rssi >= -70:
		return "medium"
	default:
		return "weak"
	}
}

func intState(st map[string]any, key string) int {
	v, _ := st[key].(int)
	return v
}

func numberState(st map[string]any, key string) (float64, bool) {
	switch v := st[key].(type) {
	case int:
		return float64(v), true
	case float64:
		return v, true
	}
	return 0, false
}

// SystemInfoJSON returns the board's system information: the body a real
// board POSTs to its OTA endpoint and the result of self.get_system_info.
// The firmware builds it by concatenation, so the key order, the string
// minimum_free_heap_size and the space after "partition_table": are part
// of the format.
func (b *Board) SystemInfoJSON() string {
	p := b.profile
	st := b.State()
	sum := sha256.Sum256([]byte(p.Board + "/" + p.Firmware))
	var sb strings.Builder
	sb.WriteString(`{"version":2,"language":"` + p.Language + `"`)
	sb.WriteString(`,"flash_size":` + strconv.Itoa(sysFlashSize))
	sb.WriteString(`,"minimum_free_heap_size":"` + sysMinFreeHeap + `"`)
	sb.WriteString(`,"mac_address":"` + b.mac + `","uuid":"` + b.clientID + `"`)
	sb.WriteString(`,"chip_model_name":"` + p.ChipModel + `","chip_info":` + sysChipInfo)
	sb.WriteString(`,"application":{"name":"xiaozhi","version":"` + p.Firmware + `","compile_time":"` + sysCompileTime +
		`","idf_version":"` + sysIDFVersion + `","elf_sha256":"` + hex.EncodeToString(sum[:]) + `"}`)
	sb.WriteString(`,"partition_table": [` + sysPartitions + `]`)
	sb.WriteString(`,"ota":{"label":"ota_0"}`)
	if d := p.Display; d != nil {
		sb.WriteString(`,"display":{"monochrome":` + strconv.FormatBool(d.Monochrome) +
			`,"width":` + strconv.Itoa(d.Width) + `,"height":` + strconv.Itoa(d.Height) + `}`)
	}
	ssid, _ := st[stateSSID].(string)
	ip, _ := st[stateIP].(string)
	sb.WriteString(`,"board":{"type":"` + p.BoardType + `","name":"` + p.Board + `","manufacturer":""`)
	sb.WriteString(`,"ssid":"` + ssid + `","rssi":` + strconv.Itoa(intState(st, stateRSSI)) +
		`,"channel":` + strconv.Itoa(intState(st, stateChannel)) + `,"ip":"` + ip + `"`)
	sb.WriteString(`,"mac":"` + b.mac + `"}}`)
	return sb.String()
}
