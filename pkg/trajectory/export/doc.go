// Package export writes a recorded episode (its episodes row and its steps rows, as
// package trajectory reads them from ClickHouse) out of gauntlet, and reads it back:
//
//   - JSONL, gauntlet's own: a first line {"episode": {...}} and then one line
//     {"step": {...}} per step, each object keyed by its table's column names
//     (trajectory.MarshalStepJSON). It is lossless: ReadJSONL returns the same rows.
//   - ATIF, the Agent Trajectory Interchange Format Harbor defined (v1.4, see
//     docs/tasks.md for the source): the episode is one trajectory whose session_id is
//     the episode id and whose agent is the policy; each recorded step is one agent step
//     with the tool call (function_name, arguments) and its observation, and the whole
//     recorded row in the step's extra.gauntlet_step, so that FromATIF returns the same
//     rows. FromATIF also checks that the standard fields agree with the recorded row, so
//     an edited export is refused rather than read as a recording.
//
// Everything is pure encoding: no I/O beyond the reader or writer given.
package export
