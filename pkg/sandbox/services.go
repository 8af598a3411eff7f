package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Service is a host service a sandbox may reach: the runtime makes it
// answer inside the sandbox's loopback-only network at 127.0.0.1:Port, also reachable by
// Name (answered by the sandbox's name server, see ResolverListener) and announced in the environment
// (<NAME>_ADDR=name:port, and <NAME>_URL=http://name:port for HTTP services). Nothing
// listens there until a gateway (package svcnet) is attached: the gateway forwards each
// connection to Upstream from the host process, applying the episode's network and
// service faults on the way. Nothing else outside the sandbox becomes reachable.
type Service struct {
	// Name is the service's host name inside the sandbox and its fault target
	// (lower-case letters, digits and '-', starting with a letter, at most 32).
	Name string `json:"name"`
	// Port is the port the service answers on inside the sandbox (1-65535).
	Port int `json:"port"`
	// Upstream is where the host process forwards to: host:port, reached from the host's
	// network (typically a service the env runs on the host's loopback).
	Upstream string `json:"upstream"`
	// Protocol is "http" (the default: requests pass through the fault proxy), "tcp"
	// (bytes pass through the fault connection layer) or "egress" (see Hosts).
	Protocol string `json:"protocol,omitempty"`
	// Hosts are, for an egress service only, the host names the sandbox may reach: each
	// resolves (through the sandbox's name server) to 127.0.0.1, where the gateway on
	// Port takes plain HTTP requests, refuses them unless their host is one of these, and
	// forwards them to where the host process reaches that host (HostMapper, else the
	// name itself on port 80). An egress service has no Upstream. Every other name stays
	// unresolvable and no address outside the sandbox becomes reachable, so a task's
	// allow-list cannot be bypassed by an address.
	Hosts []string `json:"hosts,omitempty"`
	// TLSPorts are, for an egress service only, the other ports its gateway answers on
	// (443, and those the runtime maps for the hosts): each connection there must open
	// with a TLS ClientHello naming one of Hosts (SNI), and is relayed unopened to where
	// the host process reaches that host on that port (HostMapper, else the name itself
	// on the port).
	TLSPorts []int `json:"tls_ports,omitempty"`
	// TCPPorts are, for an egress service only, the ports relayed as plain TCP, each to
	// the one host of Hosts it is declared for (a runtime's NAME:PORT/tcp mapping): a
	// plain stream names no host, so the gateway knows it by the port alone. Each
	// connection there is relayed to where the host process reaches that port of that
	// host (HostMapper, else the name itself on the port).
	TCPPorts []HostPort `json:"tcp_ports,omitempty"`
}

// HostPort is one port of an allowed host.
type HostPort struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// Service protocols.
const (
	ProtocolHTTP = "http"
	ProtocolTCP  = "tcp"
	// ProtocolEgress is the gateway to a sandbox's allowed hosts (Service.Hosts).
	ProtocolEgress = "egress"
)

// HostMapper is the optional ability of a runtime to say where the host process reaches
// a port of an allowed host (Service.Hosts) by name: an operator's mapping
// (--sandbox.hosts), such as a mirror, or in tests a server on the host's loopback. Ports
// it does not map are reached at the host's own name and that port, through the host's
// resolver.
type HostMapper interface {
	// HostUpstream returns the host:port that port of name is reached at, and whether
	// the runtime maps it (as HTTP or TLS, or as plain TCP).
	HostUpstream(name string, port int) (string, bool)
	// HostPorts returns the ports of name the runtime maps as HTTP (80) or TLS,
	// ascending.
	HostPorts(name string) []int
	// HostTCPPorts returns the ports of name the runtime maps as plain TCP, ascending.
	HostTCPPorts(name string) []int
}

// HostMap maps allowed hosts' ports to the host:port the host process reaches each at: a
// runtime's configured mapping (its methods are a HostMapper's). A key is a host name
// (its port 80, the HTTP the gateway proxies), NAME:PORT (a TLS port) or
// NAME:PORT/tcp (a port relayed as plain TCP), as --sandbox.hosts writes them.
type HostMap map[string]string

// TCPSuffix marks a HostMap key whose port is relayed as plain TCP.
const TCPSuffix = "/tcp"

// HostUpstream returns where port of name is reached, and whether m maps it.
func (m HostMap) HostUpstream(name string, port int) (string, bool) {
	if port == HTTPPort {
		if a, ok := m[name]; ok {
			return a, true
		}
	}
	k := net.JoinHostPort(name, strconv.Itoa(port))
	if a, ok := m[k]; ok {
		return a, true
	}
	a, ok := m[k+TCPSuffix]
	return a, ok
}

// HostPorts returns the HTTP and TLS ports of name m maps, ascending.
func (m HostMap) HostPorts(name string) []int { return m.ports(name, false) }

// HostTCPPorts returns the plain TCP ports of name m maps, ascending.
func (m HostMap) HostTCPPorts(name string) []int { return m.ports(name, true) }

func (m HostMap) ports(name string, tcp bool) []int {
	var out []int
	for k := range m {
		k, isTCP := strings.CutSuffix(k, TCPSuffix)
		if isTCP != tcp {
			continue
		}
		h, p, ok := SplitHostKey(k)
		if ok && h == name && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// HTTPPort is the port of an allowed host a HostMap key without a port names.
const HTTPPort = 80

// SplitHostKey splits a HostMap key into its host name and port (HTTPPort when it names
// none); ok is false unless the name is a ValidHostName and the port 1-65535, written
// in decimal without sign or leading zeros.
func SplitHostKey(key string) (name string, port int, ok bool) {
	name, ps, hasPort := strings.Cut(key, ":")
	if !ValidHostName(name) {
		return "", 0, false
	}
	if !hasPort {
		return name, HTTPPort, true
	}
	p, err := strconv.Atoi(ps)
	if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != ps {
		return "", 0, false
	}
	return name, p, true
}

// ValidHostName reports whether name is a DNS host name as allow-lists write it: lower
// case, dot-separated labels of letters, digits and '-' (not at a label's ends), at most
// 63 bytes each and 253 in all, the last not all digits (so no IPv4 address passes).
func ValidHostName(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	labels := strings.Split(name, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	return strings.Trim(last, "0123456789") != ""
}

// ServiceListener is the optional ability to open a listening socket inside a sandbox's
// network namespace while the listener itself lives in the caller's process, so Accept
// and everything that follows run on the host side. Package svcnet uses it to attach a
// sandbox's declared services.
type ServiceListener interface {
	// ListenService listens on 127.0.0.1:port inside the sandbox's network namespace. The
	// port must be one the sandbox's Spec.Services declares. The caller closes the
	// listener. A runtime whose sandbox changes network namespace (containerd's Restore
	// restarts the task) leaves earlier listeners dead: listen again after it.
	ListenService(ctx context.Context, id string, port int) (net.Listener, error)
}

// RefusalWatcher is the optional ability to watch the refusals a sandbox with services
// meets on its own loopback (a TCP reset, an ICMP "port unreachable": a connection or a
// datagram to a port nothing listens on), which its kernel answers without anything
// reaching the caller's process, so that they can be recorded (package svcnet does so
// for an egress service: a port of an allowed host that is not declared).
type RefusalWatcher interface {
	// WatchRefusals opens netns.WatchRefusals in sandbox id's network namespace: each
	// Read of the file returns one such packet. The caller closes it. The sandbox must
	// declare services. As with ListenService, a runtime whose sandbox changes network
	// namespace leaves an earlier file deaf.
	WatchRefusals(ctx context.Context, id string) (*os.File, error)
}

// validServiceName reports whether name is 1-32 lower-case ASCII letters, digits or '-',
// starting with a letter (no regexp: see ValidID).
func validServiceName(name string) bool {
	if len(name) == 0 || len(name) > 32 || name[0] < 'a' || name[0] > 'z' {
		return false
	}
	for i := 1; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// validateServices checks the services of a spec, each problem wrapping ErrInvalid.
func validateServices(svcs []Service) []error {
	var errs []error
	names, ports, all := map[string]bool{}, map[int]bool{}, map[string]bool{}
	for _, s := range svcs {
		all[s.Name] = true
	}
	egress := false
	for i, s := range svcs {
		f := fmt.Sprintf("services[%d]", i)
		bad := func(field, format string, args ...any) {
			errs = append(errs, fmt.Errorf("%w: %s.%s: %s", ErrInvalid, f, field, fmt.Sprintf(format, args...)))
		}
		switch {
		case !validServiceName(s.Name):
			bad("name", "%q must be 1-32 lower-case letters, digits or '-', starting with a letter", s.Name)
		case s.Name == "localhost" || s.Name == "sandbox":
			bad("name", "%q is reserved", s.Name)
		case names[s.Name]:
			bad("name", "%q appears twice", s.Name)
		}
		names[s.Name] = true
		switch {
		case s.Port < 1 || s.Port > 65535:
			bad("port", "%d must be 1-65535", s.Port)
		case ports[s.Port]:
			bad("port", "%d is used by another service", s.Port)
		}
		ports[s.Port] = true
		if s.Protocol == ProtocolEgress {
			if egress {
				bad("protocol", "a second egress service; one gateway serves every allowed host")
			}
			egress = true
			if s.Upstream != "" {
				bad("upstream", "%q: an egress service forwards to its hosts, it has no upstream", s.Upstream)
			}
			for j, p := range s.TLSPorts {
				switch {
				case p < 1 || p > 65535:
					bad(fmt.Sprintf("tls_ports[%d]", j), "%d must be 1-65535", p)
				case ports[p]:
					bad(fmt.Sprintf("tls_ports[%d]", j), "%d is used by another service or appears twice", p)
				}
				ports[p] = true
			}
			for j, hp := range s.TCPPorts {
				f := fmt.Sprintf("tcp_ports[%d]", j)
				switch {
				case hp.Port < 1 || hp.Port > 65535:
					bad(f, "%d must be 1-65535", hp.Port)
				case ports[hp.Port]:
					bad(f, "%d is used by another service or port, or appears twice: a plain TCP port is one host's", hp.Port)
				}
				ports[hp.Port] = true
				if !slices.Contains(s.Hosts, hp.Host) {
					bad(f, "host %q is not one of the service's hosts", hp.Host)
				}
			}
			seen := map[string]bool{}
			for j, h := range s.Hosts {
				switch {
				case !ValidHostName(h):
					bad(fmt.Sprintf("hosts[%d]", j), "%q is not a lower-case DNS host name", h)
				case h == "localhost" || h == "sandbox" || all[h]:
					bad(fmt.Sprintf("hosts[%d]", j), "%q is reserved or a service's name", h)
				case seen[h]:
					bad(fmt.Sprintf("hosts[%d]", j), "%q appears twice", h)
				}
				seen[h] = true
			}
			continue
		}
		if len(s.Hosts) > 0 {
			bad("hosts", "only an egress service has hosts")
		}
		if len(s.TLSPorts) > 0 {
			bad("tls_ports", "only an egress service has TLS ports")
		}
		if len(s.TCPPorts) > 0 {
			bad("tcp_ports", "only an egress service has plain TCP ports")
		}
		if host, port, err := net.SplitHostPort(s.Upstream); err != nil || host == "" {
			bad("upstream", "%q must be host:port", s.Upstream)
		} else if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			bad("upstream", "%q: port must be 1-65535", s.Upstream)
		}
		if s.Protocol != "" && s.Protocol != ProtocolHTTP && s.Protocol != ProtocolTCP {
			bad("protocol", "%q is not %q, %q or %q", s.Protocol, ProtocolHTTP, ProtocolTCP, ProtocolEgress)
		}
	}
	return errs
}

// ServiceByPort returns the declared service answering on port inside the sandbox (an
// egress service's TLSPorts and TCPPorts are its too).
func ServiceByPort(svcs []Service, port int) (Service, bool) {
	for _, s := range svcs {
		if s.Port == port || slices.Contains(s.TLSPorts, port) || slices.ContainsFunc(s.TCPPorts, func(hp HostPort) bool { return hp.Port == port }) {
			return s, true
		}
	}
	return Service{}, false
}

// ServiceEnv returns the environment announcing the services: <NAME>_ADDR=name:port for
// each, and <NAME>_URL=http://name:port for HTTP ones (NAME upper-cased, '-' as '_'). An
// egress service is announced by nothing: its hosts are reached by their own names.
func ServiceEnv(svcs []Service) []string {
	var env []string
	for _, s := range svcs {
		if s.Protocol == ProtocolEgress {
			continue
		}
		k := strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
		addr := net.JoinHostPort(s.Name, strconv.Itoa(s.Port))
		env = append(env, k+"_ADDR="+addr)
		if s.Protocol == "" || s.Protocol == ProtocolHTTP {
			env = append(env, k+"_URL=http://"+addr)
		}
	}
	return env
}

// HostsFile returns the /etc/hosts of a sandbox with services: localhost and the
// sandbox's own name on 127.0.0.1. The service names are not in it: they resolve through
// the sandbox's name server (ResolvConf), where DNS faults apply.
func HostsFile() string {
	return "127.0.0.1 localhost sandbox\n::1 localhost\n"
}

// ErrNotDeclared is returned by ListenService for a port no declared service uses.
var ErrNotDeclared = errors.New("no declared service on that port")
