package mqtt

import "github.com/devicebridge/devicebridge/internal/logthrottle"

// gatewayWarnings are the gateway's log lines that a board or the broker
// can repeat at will (a flood, garbage, a broker that drops the bridge
// again and again). Each kind is written at most once per interval
// whichever board caused it, with a count of the lines left out, so the
// log stays readable however many boards misbehave.
type gatewayWarnings struct {
	// Uplink messages dropped before they reach a board's link.
	unknownTopic, oversized, discoveryFull logthrottle.Throttle
	// A board's link.
	inboxFull, malformed, badHello, helloUnanswered logthrottle.Throttle
	rateLimited, cutOff                             logthrottle.Throttle
	staleGoodbye, notAttached                       logthrottle.Throttle
	// The broker and the fleet.
	connLost, subscribe, claim logthrottle.Throttle
}

// linkNotes are a board's own informational lines that it can repeat at
// will (a hello opens an audio session); kept per board, so every board's
// first line is written.
type linkNotes struct {
	audioOpened, audioClosed logthrottle.Throttle
}
