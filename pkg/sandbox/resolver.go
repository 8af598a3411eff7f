package sandbox

import (
	"context"
	"net"
)

// The name server of a sandbox with services: the names of its declared services
// resolve through DNS, not /etc/hosts, so the episode's DNS faults (dns_nxdomain,
// dns_servfail, dns_timeout) reach every program that looks a service up. The runtime
// points the sandbox's resolver at ResolverIP:53 (ResolvConf, with NsswitchConf for
// glibc programs); package svcnet answers there, from the host process, once a gateway
// is attached. Until then lookups of the services fail at once (nothing listens).
const (
	// ResolverIP is the name server's address inside the sandbox's network namespace
	// (on its loopback, like systemd-resolved's stub).
	ResolverIP = "127.0.0.53"
	// ResolverPort is its port, UDP and TCP.
	ResolverPort = 53
)

// ResolverListener is the optional ability to open the name server's sockets
// (ResolverIP:ResolverPort, UDP and TCP) inside a sandbox's network namespace while they
// live in the caller's process, like ServiceListener. Package svcnet uses it to answer
// the sandbox's lookups.
type ResolverListener interface {
	// ListenResolver opens the UDP and TCP sockets of the name server of sandbox id,
	// which must declare services. The caller closes both. As with ListenService, a
	// runtime whose sandbox changes network namespace leaves earlier sockets dead.
	ListenResolver(ctx context.Context, id string) (net.PacketConn, net.Listener, error)
}

// ResolvConf returns the /etc/resolv.conf of a sandbox with services: the name server
// at ResolverIP, one second per try and two tries, so a lookup meeting dns_timeout fails
// after about two seconds (glibc's defaults would make it ten).
func ResolvConf() string {
	return "nameserver " + ResolverIP + "\noptions timeout:1 attempts:2\n"
}

// NsswitchConf returns the /etc/nsswitch.conf of a sandbox with services: /etc/hosts
// (localhost and the sandbox's own name) first, then DNS (the services).
func NsswitchConf() string {
	return "passwd: files\ngroup: files\nhosts: files dns\n"
}
