// Package play is the one episode runner: every episode of every env, whoever chooses its
// actions (a built-in policy in a worker or a durable episode, a model endpoint, a trainer
// over the env API, the CLI forking a recorded episode, the load-test harness), is built by
// Deps.Prepare, played by Session.Step and Session.Run, and rebuilt by Session.Replay. Each
// action is applied to the env, timed (the env's call, the policy's turn before it, and
// the scoring after it), recorded as a StepTaken (StepEvent), scored (a
// StepScorer: the reward service over NATS, or the same pure function in process) and
// handed to the caller's Output, which publishes it to GAUNTLET_EVENTS (Publisher, in
// segments carrying the episode's start and end), one event per step, or wherever the
// caller records it. A trajectory therefore looks the same whoever played it, and every
// caller gets sandboxes, fault templates and faults the same way.
//
// Concurrency: a Session belongs to one goroutine at a time (callers serialise its
// methods); Deps and a Scorer are shared by many sessions and safe for concurrent use.
package play
