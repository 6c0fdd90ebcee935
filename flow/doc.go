// Package flow is the interaction engine: it runs one tool call as a
// conversation (MCP Flow: prompt, validate, confirm, complete), knowing
// nothing about boards, MCP transports or HTTP. It takes a tool's input
// schema and a function that executes it (Tool), and owns:
//
//   - validating arguments and answers with internal/argcheck, the
//     bridge's one validator (the same verdict and wording as a plain
//     tools/call or the control API): github.com/google/jsonschema-go
//     reads each distinct schema once (cached here) and gives the
//     verdict, with the firmware's rules and a teaching layer on top:
//     integers are whole int32 values, a value of the wrong type is
//     refused (a board would treat it as absent and silently use a
//     default), and every refusal says what to send instead, with an
//     example. The engine adds a size limit on each value;
//   - turning argcheck's properties into prompts (Appendix A of the
//     spec): integer and number → number (validation min/max), boolean →
//     confirm, enum → choice, string with format date → date, other
//     strings → text (pattern, min/max length), anything else → custom;
//     defaults become defaultValue. One prompt per required property that is missing or
//     invalid; optional ones only when the tool has no required ones and
//     the caller asked for guidance (StartOptions.Guided). Tools with
//     Confirm end with a confirmation prompt; declining cancels with
//     nothing run;
//   - the state machine idle → active → waiting_user ⇄ processing →
//     completed / cancelled / error (CanMove), with expiry, per-owner and
//     per-interaction limits, and the spec's error codes (*Error);
//   - interaction identity: 128-bit random ids visible only to their
//     owner, or, with Options.Secret, stateless tokens that carry the whole
//     state signed with HMAC-SHA256 and bound to the owner (Appendix B),
//     so that a restarted bridge or another replica can continue. Each
//     token is used once (SpentStore: in memory, or shared by a fleet), so
//     a replayed one runs nothing.
//
// # Two ways in
//
// MCP Flow methods (wired in mcpserver/) map one to one onto the Engine:
// interaction.start → Start, interaction.respond → Respond (its result
// also carries what the spec sends as interaction.prompt / continue /
// complete, since a server cannot always push), interaction.getState →
// GetState, interaction.cancel → Cancel. An *Error is a JSON-RPC error
// object as it stands.
//
// The standard MCP path (elicitation inside tools/call, or MRTR
// input_required rounds) uses the same pieces without an Engine:
//
//	plan, err := tool.Plan(args, false)       // *Error on arguments prompting cannot fix
//	for !plan.Ready() && !plan.Declined {
//		schema, err := flow.ElicitSchema(plan.Asks()) // flat requestedSchema
//		// elicit; on decline/cancel stop without running
//		plan, err = tool.Answer(plan, content)     // merges, re-checks; refused answers come back as Prompts with Error
//	}
//	if plan.Ready() { res, err := tool.Execute(ctx, plan.Args) }
//
// # Results
//
// Execute runs with the context of the Start or Respond call that
// completed the interaction. An error from it ends the interaction in
// state error (Step.Result has Success false and the error text); a
// Result with IsError ends it in state completed with Result.IsError and
// Success false: the tool did run and answered, which is not an engine
// failure.
//
// # Lock order
//
// Engine.mu (interactions, the expiry heap, per-owner counts) and
// MemorySpent.mu are never held together: the Engine calls its SpentStore,
// which in a fleet goes to NATS, and Lookup with no lock held. Under
// Engine.mu only context cancel functions run. The package starts no
// goroutine.
package flow
