package main

// approvals and approve: the boards that called the bridge's OTA endpoint,
// and admitting one that waits for approval (--ota-approval), over
// GET /api/ota/devices and POST /api/ota/devices/{code|mac}/approve.

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"sort"
	"time"
)

// otaBoard is a row of GET /api/ota/devices.
type otaBoard struct {
	DeviceID         string     `json:"device_id"`
	Board            string     `json:"board"`
	Firmware         string     `json:"firmware"`
	Code             string     `json:"code"`
	Transport        string     `json:"transport"`
	FirstSeen        time.Time  `json:"first_seen"`
	LastSeen         time.Time  `json:"last_seen"`
	ApprovedAt       *time.Time `json:"approved_at"`
	RejectedClientID string     `json:"rejected_client_id"`
	Admission        string     `json:"admission"`
}

type otaList struct {
	Approval   bool       `json:"approval"`
	Pending    int        `json:"pending"`
	MaxPending int        `json:"max_pending"`
	Devices    []otaBoard `json:"devices"`
}

// noOTA turns the answer of a bridge without the OTA endpoint into a
// sentence that says so.
func noOTA(err error) error {
	var ae *apiError
	if errors.As(err, &ae) && ae.Code == "not_found" {
		return errf(exitFailed, "the bridge serves no OTA endpoint, so no board waits for approval (it runs with --ota=false)")
	}
	return err
}

func (c *cli) approvals(ctx context.Context) error {
	var raw json.RawMessage
	if err := c.do(ctx, "GET", "/api/ota/devices", nil, &raw); err != nil {
		return noOTA(err)
	}
	if c.json {
		return c.printJSON(raw)
	}
	var list otaList
	if err := json.Unmarshal(raw, &list); err != nil {
		return err
	}
	if list.Approval {
		c.stdout.printf("approval is on: %s (at most %d)\n", plural(list.Pending, "board waits", "boards wait"), list.MaxPending)
	} else {
		c.stdout.println("approval is off (--ota-approval): boards are admitted without it")
	}
	if len(list.Devices) == 0 {
		c.stdout.println("no board has called the OTA endpoint yet")
		return nil
	}
	// Waiting boards first, then the most recently seen.
	sort.SliceStable(list.Devices, func(i, j int) bool {
		a, b := list.Devices[i], list.Devices[j]
		if (a.Admission == "pending") != (b.Admission == "pending") {
			return a.Admission == "pending"
		}
		return a.LastSeen.After(b.LastSeen)
	})
	c.stdout.println()
	tw := c.stdout.table()
	tw.row("ADMISSION", "CODE", "DEVICE", "BOARD", "FIRMWARE", "TRANSPORT", "FIRST SEEN", "LAST SEEN")
	for _, b := range list.Devices {
		tw.row(dash(b.Admission), dash(b.Code), b.DeviceID, dash(b.Board), dash(b.Firmware), dash(b.Transport), ago(b.FirstSeen), ago(b.LastSeen))
	}
	if err := tw.flush(); err != nil {
		return err
	}
	for _, b := range list.Devices {
		if b.RejectedClientID != "" {
			c.stdout.printf("%s: another Client-Id (%s) was refused for it; if its flash was erased, reset it with POST /api/ota/devices/%s/reset\n",
				b.DeviceID, b.RejectedClientID, b.DeviceID)
		}
	}
	if list.Pending > 0 {
		c.stdout.println()
		c.stdout.println("admit one with: devicebridge approve <code or MAC>")
	}
	return nil
}

func (c *cli) approve(ctx context.Context, id string) error {
	var raw json.RawMessage
	if err := c.do(ctx, "POST", "/api/ota/devices/"+url.PathEscape(id)+"/approve", nil, &raw); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Code == "unknown_device" {
			return errf(exitNotFound, "no board with the activation code or MAC %s is waiting (devicebridge approvals lists them)", id)
		}
		return noOTA(err)
	}
	if c.json {
		return c.printJSON(raw)
	}
	var b otaBoard
	if err := json.Unmarshal(raw, &b); err != nil {
		return err
	}
	c.stdout.printf("approved %s (%s): it is admitted at its next OTA check, within seconds\n", b.DeviceID, dash(b.Board))
	return nil
}
