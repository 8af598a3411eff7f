package gauntletv1

import "strings"

// Name is the reason's short lower-case name, as stored in ClickHouse and shown to users:
// "success", "max_steps", "infra_error"; "" for unspecified.
func (r TerminationReason) Name() string {
	if r == TerminationReason_TERMINATION_REASON_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(r.String(), "TERMINATION_REASON_"))
}
