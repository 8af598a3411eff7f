package taskenv

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/boundary"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/svcnet"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// EgressService is the name of the sandbox service that is an allowlist task's gateway
// to its allowed hosts; it answers plain HTTP on EgressPort and TLS on EgressTLSPort
// (and on the other ports the runtime maps for the hosts), where the hosts resolve.
const (
	EgressService = "egress"
	EgressPort    = 80
	EgressTLSPort = 443
)

// egressServices are the services of a task's sandbox: for network_mode "allowlist", the
// egress gateway to its allowed_hosts (none: every request refused and recorded), with
// HTTPS and every other port rt maps for them (sandbox.HostMapper) relayed as TLS, but
// the ports it maps as plain TCP, each relayed to its one host;
// nothing for "public" and "no-network", which both run without a network (there is no
// internet to grant).
func egressServices(c tasks.EnvironmentConfig, rt sandbox.Runtime) []sandbox.Service {
	if c.NetworkMode != tasks.NetworkAllowlist {
		return nil
	}
	ports := []int{EgressTLSPort}
	var tcp []sandbox.HostPort
	if hm, ok := rt.(sandbox.HostMapper); ok {
		for _, h := range c.AllowedHosts {
			for _, p := range hm.HostPorts(h) {
				if p != EgressPort && !slices.Contains(ports, p) {
					ports = append(ports, p)
				}
			}
			for _, p := range hm.HostTCPPorts(h) {
				tcp = append(tcp, sandbox.HostPort{Host: h, Port: p})
			}
		}
	}
	slices.Sort(ports)
	slices.SortFunc(tcp, func(a, b sandbox.HostPort) int { return a.Port - b.Port })
	return []sandbox.Service{{Name: EgressService, Port: EgressPort, Protocol: sandbox.ProtocolEgress, Hosts: c.AllowedHosts, TLSPorts: ports, TCPPorts: tcp}}
}

// network is an episode's record of what its agent's commands tried on the network, and
// the attachment of its sandbox's egress gateway, if the task allows hosts: what the
// agent's requests meet and how they are recorded.
type network struct {
	services []sandbox.Service
	d        *inject.Decider
	gw       *svcnet.Gateway // nil when the task allows no hosts
	rec      *svcnet.Recorder
	// clock is the virtual time the running call started at, as the gateway's goroutines
	// read it to stamp faults.
	clock *atomic.Int64
}

// attachNetwork opens the egress gateway of sandbox id with decider d, its requests
// recorded in rec (a new one when nil). Without services (the task allows no hosts) it
// opens nothing: the record then holds the commands' refused attempts at addresses
// alone (egress).
func attachNetwork(ctx context.Context, rt sandbox.Runtime, id string, svcs []sandbox.Service, d *inject.Decider, rec *svcnet.Recorder, now time.Duration) (*network, error) {
	n := &network{services: svcs, d: d, rec: rec, clock: new(atomic.Int64)}
	n.clock.Store(int64(now))
	if n.rec == nil {
		n.rec = &svcnet.Recorder{Now: func() time.Duration { return time.Duration(n.clock.Load()) }}
	}
	if len(svcs) == 0 {
		return n, nil
	}
	gw, err := svcnet.Attach(ctx, rt, id, svcs, svcnet.Options{Decider: d, OnFire: n.rec.OnFire, OnRequest: n.rec.OnRequest})
	if err != nil {
		return nil, fmt.Errorf("tasks: allowed hosts of sandbox %s: %w", id, err)
	}
	n.gw = gw
	return n, nil
}

// publish makes at the time the gateway stamps faults with.
func (n *network) publish(at time.Duration) {
	if n != nil {
		n.clock.Store(int64(at))
	}
}

// close detaches the gateway; safe on nil.
func (n *network) close() {
	if n != nil && n.gw != nil {
		_ = n.gw.Close()
		n.gw = nil
	}
}

// settle waits until the gateway has recorded what the sandbox did on the network so
// far (svcnet.Gateway.Settle), before the step takes its faults and diff; safe on nil.
func (n *network) settle(ctx context.Context) {
	if n != nil && n.gw != nil {
		n.gw.Settle(ctx)
	}
}

// faults returns the faults the gateway fired since the last call.
func (n *network) faults() []*gauntletv1.FaultFired {
	if n == nil {
		return nil
	}
	return n.rec.Take()
}

// egress records a command's refused attempts at addresses outside the sandbox as
// denied entries of the step's diff (a tools.Options.OnEgress); safe on nil.
func (n *network) egress(attempts []sandbox.EgressAttempt, dropped int64) {
	if n != nil {
		n.rec.OnEgress(attempts, dropped)
	}
}

// netEntry is one entry of a step's diff: a request through the egress gateway, a
// refused lookup, or a refused attempt at a port or an address.
type netEntry struct {
	Net svcnet.Request `json:"net"`
}

// diff returns the step's diff: the requests made since the last call, in the order they
// began (svcnet.Recorder.TakeRequests), each command's refused attempts at addresses
// after what it sent through the gateway ("[]" for none).
func (n *network) diff() []byte {
	if n == nil {
		return []byte("[]")
	}
	reqs := n.rec.TakeRequests()
	if len(reqs) == 0 {
		return []byte("[]")
	}
	out := make([]netEntry, len(reqs))
	for i, r := range reqs {
		out[i] = netEntry{r}
	}
	b, err := json.Marshal(out)
	if err != nil {
		return []byte("[]")
	}
	return b
}

// servicesDecider is the decider of an episode's network faults: the plan's, as a
// sandbox's services meet them.
func servicesDecider(in *inject.Injector) *inject.Decider { return boundary.ServicesDecider(in) }
