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

// Name is the kind's short lower-case name, as stored in ClickHouse and shown to users:
// "gauntlet", "model_endpoint", "sandbox", "verifier"; "" for unspecified.
func (k InfraKind) Name() string {
	if k == InfraKind_INFRA_KIND_UNSPECIFIED {
		return ""
	}
	return strings.ToLower(strings.TrimPrefix(k.String(), "INFRA_KIND_"))
}
