package faults

import (
	"slices"
)

// Layer is the boundary a fault kind acts on.
type Layer string

// Layers of the catalogue (B1).
const (
	LayerNetwork  Layer = "network"
	LayerStorage  Layer = "storage"
	LayerService  Layer = "service"
	LayerResource Layer = "resource"
)

// Pass is a kind's place in the composition order: every abort is tried before any delay,
// every delay before any rewrite (B2).
type Pass int

// Composition passes, in order.
const (
	PassAbort Pass = iota
	PassDelay
	PassRewrite
	// PassAmbient is for resource faults, which shape the sandbox rather than one event.
	PassAmbient
)

func (p Pass) String() string {
	switch p {
	case PassAbort:
		return "abort"
	case PassDelay:
		return "delay"
	case PassRewrite:
		return "rewrite"
	}
	return "ambient"
}

// Kinds of the full catalogue, beyond the three the sim plans use (KindHTTPError,
// KindLatency, KindTruncate).
const (
	KindPacketLoss     = "packet_loss"
	KindBandwidth      = "bandwidth"
	KindReset          = "reset"
	KindTimeout        = "timeout"
	KindDNSNXDomain    = "dns_nxdomain"
	KindDNSServFail    = "dns_servfail"
	KindDNSTimeout     = "dns_timeout"
	KindIOLatency      = "io_latency"
	KindIOPSCap        = "iops_cap"
	KindDiskFull       = "disk_full"
	KindInodes         = "inode_exhaustion"
	KindTooManyFiles   = "too_many_open_files"
	KindLockContention = "lock_contention"
	KindReadOnly       = "read_only"
	KindShortWrite     = "short_write"
	KindHeaderMissing  = "header_missing"
	KindHeaderGarbled  = "header_garbled"
	KindBrokenGzip     = "broken_gzip"
	KindSlowBody       = "slow_body"
	KindMemoryLeak     = "memory_leak"
	KindCPUThrottle    = "cpu_throttle"
	KindClockSkew      = "clock_skew"
)

// KindInfo describes one fault kind of the catalogue: where it acts, when it composes and
// its typed parameters.
type KindInfo struct {
	Name  string
	Layer Layer
	Pass  Pass
	// Params are the kind's parameters; "probability" is every kind's first.
	Params []Param
	// Doc says what the fault does.
	Doc string
}

// Param lookup by name.
func (k KindInfo) Param(name string) (Param, bool) {
	for _, p := range k.Params {
		if p.Name == name {
			return p, true
		}
	}
	return Param{}, false
}

func num(name, unit string, lo, hi float64, integer bool, def float64, doc string) Param {
	return Param{Name: name, Unit: unit, Min: lo, Max: hi, Integer: integer, Default: def, Doc: doc}
}

func text(name, doc string) Param {
	return Param{Name: name, Unit: "text", Text: true, Doc: doc}
}

// Units and bounds shared by many parameters.
const (
	maxBytes = 1 << 40
	maxRate  = 1 << 40
)

var (
	pMeanMs   = num("mean_ms", "ms", 0, maxLatencyMs, false, 0, "mean added latency")
	pJitterMs = num("jitter_ms", "ms", 0, maxLatencyMs, false, 0, "standard deviation of the added latency")
	pDist     = Param{Name: "distribution", Unit: "text", Text: true, Choices: []string{DistNormal, DistLognormal, DistUniform},
		DefaultText: DistNormal, Doc: "shape of the latency: normal (clamped at 0), lognormal (long right tail) or uniform, all with mean mean_ms and standard deviation jitter_ms"}
)

// Latency distributions (the distribution parameter of latency and io_latency).
const (
	DistNormal    = "normal"
	DistLognormal = "lognormal"
	DistUniform   = "uniform"
)

// kinds is the catalogue of fault kinds (B1), in the order `gauntlet faults ls` prints.
var kinds = []KindInfo{
	// Network.
	{Name: KindPacketLoss, Layer: LayerNetwork, Pass: PassAbort, Doc: "drops packets (a request or a write): Gilbert two-state bursts, loss rate = rate overall",
		Params: []Param{
			num("rate", "probability", 0, 1, false, 0, "long-run fraction of packets lost"),
			num("burst_len", "packets", 1, 1e6, false, 1, "mean length of a loss burst (1: independent losses)"),
			num("rto_ms", "ms", 0, maxLatencyMs, false, 200, "delay a stream connection pays per lost write (retransmission)"),
		}},
	{Name: KindLatency, Layer: LayerNetwork, Pass: PassDelay, Doc: "adds latency with mean mean_ms and standard deviation jitter_ms", Params: []Param{pMeanMs, pJitterMs, pDist}},
	{Name: KindBandwidth, Layer: LayerNetwork, Pass: PassDelay, Doc: "caps throughput",
		Params: []Param{num("bytes_per_sec", "bytes/s", 1, maxRate, false, 0, "throughput cap")}},
	{Name: KindReset, Layer: LayerNetwork, Pass: PassAbort, Doc: "resets the connection (TCP RST) after some bytes or some time",
		Params: []Param{
			num("after_bytes", "bytes", 0, maxBytes, true, 0, "bytes passed through before the reset"),
			num("after_ms", "ms", 0, maxLatencyMs, false, 0, "time before the reset (0: only after_bytes counts)"),
		}},
	{Name: KindTimeout, Layer: LayerNetwork, Pass: PassAbort, Doc: "never answers: holds the call until the client gives up or hold_ms passes",
		Params: []Param{num("hold_ms", "ms", 0, maxLatencyMs, false, 30000, "how long the call is held before the connection closes")}},
	{Name: KindDNSNXDomain, Layer: LayerNetwork, Pass: PassAbort, Doc: "name lookup answers NXDOMAIN (no such host)"},
	{Name: KindDNSServFail, Layer: LayerNetwork, Pass: PassAbort, Doc: "name lookup answers SERVFAIL (server misbehaving, temporary)"},
	{Name: KindDNSTimeout, Layer: LayerNetwork, Pass: PassAbort, Doc: "name lookup times out",
		Params: []Param{num("after_ms", "ms", 0, maxLatencyMs, false, 5000, "time before the lookup fails")}},
	// Storage.
	{Name: KindIOLatency, Layer: LayerStorage, Pass: PassDelay, Doc: "adds latency to file operations", Params: []Param{pMeanMs, pJitterMs, pDist}},
	{Name: KindIOPSCap, Layer: LayerStorage, Pass: PassDelay, Doc: "caps file operations per second",
		Params: []Param{num("iops", "ops/s", 1, 1e9, false, 0, "operations per second")}},
	{Name: KindDiskFull, Layer: LayerStorage, Pass: PassAbort, Doc: "writes fail with ENOSPC (no space left on device)"},
	{Name: KindInodes, Layer: LayerStorage, Pass: PassAbort, Doc: "creating files fails with ENOSPC (inode table full) while writes to existing files succeed"},
	{Name: KindTooManyFiles, Layer: LayerStorage, Pass: PassAbort, Doc: "opening files fails with EMFILE (too many open files)"},
	{Name: KindLockContention, Layer: LayerStorage, Pass: PassAbort, Doc: "locks are held by someone else: EWOULDBLOCK after wait_ms",
		Params: []Param{num("wait_ms", "ms", 0, maxLatencyMs, false, 0, "time spent waiting before giving up")}},
	{Name: KindReadOnly, Layer: LayerStorage, Pass: PassAbort, Doc: "the filesystem went read-only (journal full): writes fail with EROFS"},
	{Name: KindShortWrite, Layer: LayerStorage, Pass: PassRewrite, Doc: "a write stores only part of its bytes and says so",
		Params: []Param{num("keep_fraction", "fraction", 0, 1, false, 0.5, "fraction of the bytes written")}},
	// Service.
	{Name: KindHTTPError, Layer: LayerService, Pass: PassAbort, Doc: "answers with an HTTP error instead of calling the service",
		Params: []Param{
			num("status", "status", 400, 599, true, 503, "HTTP status"),
			num("retry_after_ms", "ms", 0, maxLatencyMs, true, 0, "Retry-After sent with the error (0: none; whole seconds on the wire, rounded up)"),
		}},
	{Name: KindTruncate, Layer: LayerService, Pass: PassRewrite, Doc: "cuts the response body short",
		Params: []Param{{Name: "keep_fraction", Unit: "fraction", Min: 0, Max: 1, MaxOpen: true, Doc: "fraction of the body delivered"}}},
	{Name: KindHeaderMissing, Layer: LayerService, Pass: PassRewrite, Doc: "removes a response header", Params: []Param{text("header", "header name")}},
	{Name: KindHeaderGarbled, Layer: LayerService, Pass: PassRewrite, Doc: "replaces a response header's value with bytes that do not parse", Params: []Param{text("header", "header name")}},
	{Name: KindBrokenGzip, Layer: LayerService, Pass: PassRewrite, Doc: "sends the body as gzip that breaks part-way (Content-Encoding: gzip)"},
	{Name: KindSlowBody, Layer: LayerService, Pass: PassRewrite, Doc: "sends the body slowly, in small flushed chunks",
		Params: []Param{num("bytes_per_sec", "bytes/s", 1, maxRate, false, 0, "body throughput")}},
	// Resources (applied through cgroup knobs and the sandbox clock by the runtimes).
	{Name: KindMemoryLeak, Layer: LayerResource, Pass: PassAmbient, Doc: "memory available to the sandbox shrinks steadily, as if a neighbour leaked",
		Params: []Param{num("mb_per_min", "MiB/min", 0, 1e6, false, 0, "leak rate"), num("limit_mb", "MiB", 1, 1e7, false, 1024, "memory limit the leak starts from")}},
	{Name: KindCPUThrottle, Layer: LayerResource, Pass: PassAmbient, Doc: "caps the sandbox's CPU share (cgroup cpu.max)",
		Params: []Param{num("cpu_fraction", "fraction", 0.01, 64, false, 0, "CPUs the sandbox may use (0.5: half of one)")}},
	{Name: KindClockSkew, Layer: LayerResource, Pass: PassAmbient, Doc: "skews the sandbox clock",
		Params: []Param{num("offset_ms", "ms", -maxLatencyMs*24, maxLatencyMs*24, false, 0, "constant offset"), num("drift_ppm", "ppm", -1e6, 1e6, false, 0, "rate error")}},
}

// Kinds returns the catalogue of fault kinds, each with probability as its first
// parameter. The caller must not modify the result's Params.
func Kinds() []KindInfo {
	out := make([]KindInfo, len(kinds))
	for i, k := range kinds {
		k.Params = append([]Param{probabilityParam}, k.Params...)
		out[i] = k
	}
	return out
}

// LookupKind returns the kind of that name, with probability as its first parameter.
func LookupKind(name string) (KindInfo, bool) {
	i := slices.IndexFunc(kinds, func(k KindInfo) bool { return k.Name == name })
	if i < 0 {
		return KindInfo{}, false
	}
	k := kinds[i]
	k.Params = append([]Param{probabilityParam}, k.Params...)
	return k, true
}

// KindNames lists the catalogue's kind names in catalogue order.
func KindNames() []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = k.Name
	}
	return out
}
