// Package mcpenv owns `env: mcp`, gauntlet as an MCP harness: an env that wraps a team's
// own MCP server, declared in a YAML file (docs/mcp.md). The server is a command run in
// the episode's sandbox, spoken to over stdio or over streamable HTTP in the sandbox's own
// loopback network, or a streamable HTTP URL. Its tools are
// the episode's action space; every tools/call passes the episode's fault injector at the
// MCP boundary (aborts answered without calling the server, latency on the virtual clock,
// truncation of the answer), is metered and recorded like any step, and the reward comes
// from the declared verifier: a CEL condition over the recorded calls, or a command run
// in the sandbox once the server has stopped.
//
// Each call's answer from the server is kept in the step's diff, so a recorded episode
// replays from its recording without the server (Cassette): the remote server is outside
// the product, and a replay must not depend on it.
package mcpenv
