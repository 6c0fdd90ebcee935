package flow

import "encoding/json"

// State is an interaction's state (spec §Session Lifecycle).
type State string

// The states. Start passes through idle and active synchronously, so
// callers see waiting_user (a prompt is open), processing (an answer or
// the tool is running), or one of the final states completed, cancelled
// and error.
const (
	StateIdle        State = "idle"
	StateActive      State = "active"
	StateWaitingUser State = "waiting_user"
	StateProcessing  State = "processing"
	StateCompleted   State = "completed"
	StateCancelled   State = "cancelled"
	StateError       State = "error"
)

// transitions is the state machine: every allowed move.
var transitions = map[State][]State{
	StateIdle:        {StateActive, StateCancelled, StateError},
	StateActive:      {StateWaitingUser, StateProcessing, StateCancelled, StateError},
	StateWaitingUser: {StateProcessing, StateCancelled, StateError},
	StateProcessing:  {StateWaitingUser, StateCompleted, StateCancelled, StateError},
}

// CanMove reports whether the state machine allows moving from one state
// to another. Completed, cancelled and error are final.
func CanMove(from, to State) bool {
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Final reports whether s is a final state.
func (s State) Final() bool {
	return s == StateCompleted || s == StateCancelled || s == StateError
}

// busy reports whether a call is working on the interaction (it never
// expires then).
func (s State) busy() bool {
	return s == StateIdle || s == StateActive || s == StateProcessing
}

// Step is the outcome of Start or Respond, in the spec's wire shapes: the
// interaction.start result, the interaction.respond result
// (accepted, validation) and what follows it (interaction.prompt /
// interaction.continue with the next prompt and progress, or
// interaction.complete with result and summary), merged into one object
// because a server cannot always push the follow-up.
type Step struct {
	// SessionID identifies the interaction in later calls. In stateless
	// mode it is a signed token that changes with every step: always use
	// the latest one.
	SessionID string `json:"sessionId"`
	State     State  `json:"state"`
	// Accepted and Validation report on the answer given to Respond (nil
	// after Start). At Start, Validation reports invalid initialParams.
	Accepted   *bool       `json:"accepted,omitempty"`
	Validation *Validation `json:"validation,omitempty"`
	// InitialPrompt (after Start) or NextPrompt (after Respond) is the open
	// question, with Progress; nil when the interaction is over.
	InitialPrompt *Prompt   `json:"initialPrompt,omitempty"`
	NextPrompt    *Prompt   `json:"nextPrompt,omitempty"`
	Progress      *Progress `json:"progress,omitempty"`
	// Result and Summary are set when the interaction ended: completed
	// (the tool ran; Result.IsError if it reported a failure), cancelled
	// (declined confirmation: nothing ran) or error (Execute failed).
	Result  *Outcome `json:"result,omitempty"`
	Summary string   `json:"summary,omitempty"`
	// ExpiresAt (Unix milliseconds) is when the interaction expires
	// without further activity.
	ExpiresAt int64 `json:"expiresAt,omitempty"`
}

// Prompt returns the open question (InitialPrompt or NextPrompt), or nil.
func (s *Step) Prompt() *Prompt {
	if s.InitialPrompt != nil {
		return s.InitialPrompt
	}
	return s.NextPrompt
}

// Validation is the verdict on an answer. A refused answer comes with the
// same prompt again, whose Error and Suggestion repeat these.
type Validation struct {
	Valid      bool   `json:"valid"`
	Error      string `json:"error,omitempty"`
	Suggestion string `json:"suggestion,omitempty"`
}

// Outcome is the interaction.complete result.
type Outcome struct {
	// Success is false when Execute failed or its Result had IsError.
	Success bool   `json:"success"`
	Text    string `json:"text,omitempty"`
	Data    any    `json:"data,omitempty"`
	IsError bool   `json:"isError,omitempty"`
}

// Snapshot is the interaction.getState result.
type Snapshot struct {
	SessionID       string                     `json:"sessionId"`
	State           State                      `json:"state"`
	Metadata        Metadata                   `json:"metadata"`
	History         []Turn                     `json:"history"`
	CurrentPrompt   *Prompt                    `json:"currentPrompt"`
	AccumulatedData map[string]json.RawMessage `json:"accumulatedData"`
}

// Metadata describes an interaction. Times are Unix milliseconds.
type Metadata struct {
	CreatedAt      int64  `json:"createdAt"`
	LastActivityAt int64  `json:"lastActivityAt"`
	ToolName       string `json:"toolName"`
	// ExpiresAt is when the interaction expires without further activity.
	ExpiresAt int64 `json:"expiresAt"`
	// Prompts counts the prompts shown so far (retries included), against
	// Options.MaxPrompts.
	Prompts int `json:"prompts"`
	// Reason says why a cancelled interaction was cancelled.
	Reason string `json:"reason,omitempty"`
}

// Turn is one prompt and its answer.
type Turn struct {
	TurnID    int      `json:"turnId"`
	Prompt    *Prompt  `json:"prompt"`
	Response  Response `json:"response"`
	Timestamp int64    `json:"timestamp"`
}

// Response is an answer as recorded in the history.
type Response struct {
	Value    json.RawMessage `json:"value"`
	Accepted bool            `json:"accepted"`
	Error    string          `json:"error,omitempty"`
}

// record is one interaction's whole state. In stateful mode the engine
// keeps it in memory; in stateless mode it travels, signed, in the
// sessionId (short JSON names keep tokens small).
type record struct {
	ID        string                     `json:"i"`
	Tool      string                     `json:"t"`
	State     State                      `json:"s"`
	Args      map[string]json.RawMessage `json:"d,omitempty"`
	Pending   []string                   `json:"q,omitempty"` // properties still to ask, the open one first
	Issues    map[string]Problem         `json:"e,omitempty"` // why initial values were refused, shown with their prompt
	Confirmed bool                       `json:"k,omitempty"`
	Done      int                        `json:"n,omitempty"` // accepted answers
	Turns     int                        `json:"u,omitempty"` // prompts shown
	Current   *Prompt                    `json:"p,omitempty"`
	History   []Turn                     `json:"h,omitempty"`
	Created   int64                      `json:"c"`
	Last      int64                      `json:"a"`
	Timeout   int64                      `json:"o"`           // inactivity timeout, ms
	Hard      int64                      `json:"x,omitempty"` // hard expiry (MaxDuration), Unix ms; 0 = none
	Reason    string                     `json:"r,omitempty"`
}

const (
	reasonInactive    = "inactive"
	reasonMaxDuration = "max_duration"
)

// deadline is when the record expires (Unix ms), and why.
func (r *record) deadline() (int64, string) {
	d, why := r.Last+r.Timeout, reasonInactive
	if r.Hard > 0 && r.Hard < d {
		d, why = r.Hard, reasonMaxDuration
	}
	return d, why
}

func (r *record) clone() *record {
	c := *r
	c.Args = make(map[string]json.RawMessage, len(r.Args))
	for k, v := range r.Args {
		c.Args[k] = v
	}
	c.Pending = append([]string(nil), r.Pending...)
	if r.Issues != nil {
		c.Issues = make(map[string]Problem, len(r.Issues))
		for k, v := range r.Issues {
			c.Issues[k] = v
		}
	}
	c.History = append([]Turn(nil), r.History...)
	return &c
}

func (r *record) snapshot(id string) *Snapshot {
	c := r.clone()
	exp, _ := c.deadline()
	s := &Snapshot{SessionID: id, State: c.State, History: c.History, CurrentPrompt: c.Current,
		AccumulatedData: c.Args,
		Metadata: Metadata{CreatedAt: c.Created, LastActivityAt: c.Last, ToolName: c.Tool,
			ExpiresAt: exp, Prompts: c.Turns, Reason: c.Reason}}
	if s.History == nil {
		s.History = []Turn{}
	}
	if c.State != StateWaitingUser {
		s.CurrentPrompt = nil
	}
	return s
}
