//go:build linux

package safety

import "testing"

// TestProtocolName: the kernel's protocol names of inet sockets read as an
// EgressAttempt's protocol.
func TestProtocolName(t *testing.T) {
	for in, want := range map[string]string{
		"TCP": "TCP", "TCPv6": "TCP", "MPTCP": "TCP", "MPTCPv6": "TCP",
		"UDP": "UDP", "UDPv6": "UDP", "UDP-Lite": "UDP", "UDPLITEv6": "UDP",
		"PING": "ICMP", "PINGv6": "ICMP",
		"RAW": "RAW", "RAWv6": "RAW", "SCTP": "SCTP", "SCTPv6": "SCTP",
		"": "IP",
	} {
		if got := protocolName(in); got != want {
			t.Errorf("protocolName(%q) = %q, want %q", in, got, want)
		}
	}
}
