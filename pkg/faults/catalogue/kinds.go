package catalogue

import (
	"math"
	"regexp"
	"slices"
	"strconv"
	"syscall"
)

// Layer is the boundary a fault kind acts on.
type Layer string

// Layers of the catalogue.
const (
	LayerNetwork  Layer = "network"
	LayerStorage  Layer = "storage"
	LayerService  Layer = "service"
	LayerResource Layer = "resource"
)

// Pass is a kind's place in the composition order: every abort is tried before any delay,
// every delay before any rewrite.
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

// Fault kinds as recorded in FaultFired.kind and in ClickHouse.
const (
	KindHTTPError = "http_error"
	KindLatency   = "latency"
	KindTruncate  = "truncate"
)

// MaxLatencyMs bounds a latency rule's mean and jitter (one hour of virtual time): far
// beyond any realistic fault, and far from overflowing a time.Duration.
const MaxLatencyMs = 3_600_000

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
	// FromLog recognises the kind in logs (`gauntlet faults from-log`); nil when logs do
	// not show it.
	FromLog *LogPattern

	// ops are the operations of the kind's layer it acts on; none for resource kinds,
	// which shape the sandbox rather than one event.
	ops OpSet
	// LossChain: the kind fires through a per-stream Gilbert loss chain (packet_loss)
	// rather than an independent draw per event.
	LossChain bool
	// DrawsLatency: each firing draws a delay (mean_ms, jitter_ms, distribution) with
	// LatencyDraw, which Apply takes.
	DrawsLatency bool
	// decide returns out with a fired rule of the kind applied, and the detail its
	// FaultFired records. It takes and returns the decision by value: through a pointer
	// the decision and the event would escape to the heap on every Decide.
	decide func(out Decision, r *Rule, ev Event, latencyMs float64) (Decision, string)
	// ambient, for resource kinds, returns res with a rule of the kind in force and the
	// detail its firing records.
	ambient func(res Resources, r *Rule) (Resources, string)
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
	pMeanMs   = num("mean_ms", "ms", 0, MaxLatencyMs, false, 0, "mean added latency")
	pJitterMs = num("jitter_ms", "ms", 0, MaxLatencyMs, false, 0, "standard deviation of the added latency")
	pDist     = Param{Name: "distribution", Unit: "text", Text: true, Choices: []string{DistNormal, DistLognormal, DistUniform},
		DefaultText: DistNormal, Doc: "shape of the latency: normal (clamped at 0), lognormal (long right tail) or uniform, all with mean mean_ms and standard deviation jitter_ms"}
)

// Latency distributions (the distribution parameter of latency and io_latency).
const (
	DistNormal    = "normal"
	DistLognormal = "lognormal"
	DistUniform   = "uniform"
)

// kinds is the catalogue of fault kinds, in the order `gauntlet faults ls` prints.
// Each row is the whole of a kind: its parameters, the events it acts on (ops), what it
// does to an event when it fires (decide) and how logs show it (FromLog). Adding a kind
// is adding a row (and, for a new effect, a field to Decision).
var kinds = []KindInfo{
	// Network. Name lookups meet only the DNS kinds, and the DNS kinds only lookups; a
	// connection is reset, black-holed or capped once, when it opens, so its writes meet
	// only latency and loss.
	{Name: KindPacketLoss, Layer: LayerNetwork, Pass: PassAbort, Doc: "drops packets (a request or a write): Gilbert two-state bursts, loss rate = rate overall",
		Params: []Param{
			num("rate", "probability", 0, 1, false, 0, "long-run fraction of packets lost"),
			num("burst_len", "packets", 1, 1e6, false, 1, "mean length of a loss burst (1: independent losses)"),
			num("rto_ms", "ms", 0, MaxLatencyMs, false, 200, "delay a connection pays per lost write, or a relayed stream per lost segment (retransmission)"),
		},
		ops: notLookup, LossChain: true,
		decide: func(out Decision, r *Rule, _ Event, _ float64) (Decision, string) {
			out.RTO = ms(r.Num("rto_ms"))
			return out, "lost"
		}},
	{Name: KindLatency, Layer: LayerNetwork, Pass: PassDelay, Doc: "adds latency with mean mean_ms and standard deviation jitter_ms", Params: []Param{pMeanMs, pJitterMs, pDist},
		ops: notLookup, DrawsLatency: true, decide: addLatency,
		FromLog: &LogPattern{Rank: 120, Match: slowRE, Params: func(text string, samples map[string]float64) {
			if m := slowRE.FindStringSubmatch(text); m != nil {
				samples["latency_ms"] = atof(m[1])
			}
		}}},
	{Name: KindBandwidth, Layer: LayerNetwork, Pass: PassDelay, Doc: "caps throughput",
		Params: []Param{num("bytes_per_sec", "bytes/s", 1, maxRate, false, 0, "throughput cap")},
		ops:    atOpen,
		decide: func(out Decision, r *Rule, _ Event, _ float64) (Decision, string) {
			out.BytesPerSec = minPositive(out.BytesPerSec, r.Num("bytes_per_sec"))
			return out, "bytes_per_sec=" + fmtNum(r.Num("bytes_per_sec"))
		}},
	{Name: KindReset, Layer: LayerNetwork, Pass: PassAbort, Doc: "resets the connection (TCP RST) after some bytes or some time",
		Params: []Param{
			num("after_bytes", "bytes", 0, maxBytes, true, 0, "bytes passed through before the reset"),
			num("after_ms", "ms", 0, MaxLatencyMs, false, 0, "time before the reset (0: only after_bytes counts)"),
		},
		ops: atOpen,
		decide: func(out Decision, r *Rule, _ Event, _ float64) (Decision, string) {
			out.ResetAfterBytes, out.ResetAfter = int64(r.Num("after_bytes")), ms(r.Num("after_ms"))
			return out, "after_bytes=" + fmtNum(r.Num("after_bytes")) + " after_ms=" + fmtNum(r.Num("after_ms"))
		},
		FromLog: &LogPattern{Rank: 80, Match: regexp.MustCompile(`(?i)connection reset|ECONNRESET|connection refused|ECONNREFUSED|ConnectionResetError`)}},
	{Name: KindTimeout, Layer: LayerNetwork, Pass: PassAbort, Doc: "never answers: holds the call until the client gives up or hold_ms passes",
		Params: []Param{num("hold_ms", "ms", 0, MaxLatencyMs, false, 30000, "how long the call is held before the connection closes")},
		ops:    atOpen,
		decide: func(out Decision, r *Rule, _ Event, _ float64) (Decision, string) {
			out.Hold = ms(r.Num("hold_ms"))
			return out, "hold_ms=" + fmtNum(r.Num("hold_ms"))
		},
		FromLog: &LogPattern{Rank: 90, Match: regexp.MustCompile(`(?i)timed out|timeout|deadline exceeded`), Params: func(text string, samples map[string]float64) {
			if m := afterRE.FindStringSubmatch(text); m != nil {
				v := atof(m[1])
				if m[2] == "s" {
					v *= 1000
				}
				samples["hold_ms"] = v
			}
		}}},
	{Name: KindDNSNXDomain, Layer: LayerNetwork, Pass: PassAbort, Doc: "name lookup answers NXDOMAIN (no such host)",
		ops: opLookup, decide: hostDetail,
		FromLog: &LogPattern{Rank: 20, Match: regexp.MustCompile(`(?i)no such host|UnknownHostException|host not found|Name or service not known|NXDOMAIN|could not be resolved`)}},
	{Name: KindDNSServFail, Layer: LayerNetwork, Pass: PassAbort, Doc: "name lookup answers SERVFAIL (server misbehaving, temporary)",
		ops: opLookup, decide: hostDetail,
		FromLog: &LogPattern{Rank: 10, Match: regexp.MustCompile(`(?i)server failure|SERVFAIL|server misbehaving`)}},
	{Name: KindDNSTimeout, Layer: LayerNetwork, Pass: PassAbort, Doc: "name lookup times out",
		Params: []Param{num("after_ms", "ms", 0, MaxLatencyMs, false, 5000, "time before the lookup fails")},
		ops:    opLookup,
		decide: func(out Decision, r *Rule, ev Event, _ float64) (Decision, string) {
			out.Hold = ms(r.Num("after_ms"))
			return out, ev.Host + " after_ms=" + fmtNum(r.Num("after_ms"))
		}},
	// Storage.
	{Name: KindIOLatency, Layer: LayerStorage, Pass: PassDelay, Doc: "adds latency to file operations", Params: []Param{pMeanMs, pJitterMs, pDist},
		ops: allOps, DrawsLatency: true, decide: addLatency},
	{Name: KindIOPSCap, Layer: LayerStorage, Pass: PassDelay, Doc: "caps file operations per second",
		Params: []Param{num("iops", "ops/s", 1, 1e9, false, 0, "operations per second")},
		ops:    allOps,
		decide: func(out Decision, r *Rule, _ Event, _ float64) (Decision, string) {
			out.IOPS = minPositive(out.IOPS, r.Num("iops"))
			return out, "iops=" + fmtNum(r.Num("iops"))
		}},
	{Name: KindDiskFull, Layer: LayerStorage, Pass: PassAbort, Doc: "writes fail with ENOSPC (no space left on device)",
		ops: opWrite | opCreate | opMkdir, decide: failWith(syscall.ENOSPC, "ENOSPC "),
		FromLog: &LogPattern{Rank: 30, Match: regexp.MustCompile(`(?i)no space left on device|ENOSPC|Errno 28\b`)}},
	{Name: KindInodes, Layer: LayerStorage, Pass: PassAbort, Doc: "creating files fails with ENOSPC (inode table full) while writes to existing files succeed",
		ops: opCreate | opMkdir, decide: failWith(syscall.ENOSPC, "ENOSPC ")},
	{Name: KindTooManyFiles, Layer: LayerStorage, Pass: PassAbort, Doc: "opening files fails with EMFILE (too many open files)",
		ops: opOpen | opCreate, decide: failWith(syscall.EMFILE, "EMFILE "),
		FromLog: &LogPattern{Rank: 40, Match: regexp.MustCompile(`(?i)too many open files|EMFILE|Errno 24\b`)}},
	{Name: KindLockContention, Layer: LayerStorage, Pass: PassAbort, Doc: "locks are held by someone else: EWOULDBLOCK after wait_ms",
		Params: []Param{num("wait_ms", "ms", 0, MaxLatencyMs, false, 0, "time spent waiting before giving up")},
		ops:    opLock,
		decide: func(out Decision, r *Rule, ev Event, _ float64) (Decision, string) {
			out.Errno, out.Hold = syscall.EWOULDBLOCK, ms(r.Num("wait_ms"))
			return out, "EWOULDBLOCK " + ev.Path
		}},
	{Name: KindReadOnly, Layer: LayerStorage, Pass: PassAbort, Doc: "the filesystem went read-only (journal full): writes fail with EROFS",
		ops: opWrite | opCreate | opMkdir | opRemove | opRename, decide: failWith(syscall.EROFS, "EROFS "),
		FromLog: &LogPattern{Rank: 50, Match: regexp.MustCompile(`(?i)read-only file system|EROFS|Errno 30\b`)}},
	{Name: KindShortWrite, Layer: LayerStorage, Pass: PassRewrite, Doc: "a write stores only part of its bytes and says so",
		Params: []Param{num("keep_fraction", "fraction", 0, 1, false, 0.5, "fraction of the bytes written")},
		ops:    opWrite,
		decide: func(out Decision, r *Rule, _ Event, _ float64) (Decision, string) {
			out.WriteKeep = math.Min(out.WriteKeep, r.Num("keep_fraction"))
			return out, "keep_fraction=" + strconv.FormatFloat(r.Num("keep_fraction"), 'f', 2, 64)
		}},
	// Service.
	{Name: KindHTTPError, Layer: LayerService, Pass: PassAbort, Doc: "answers with an HTTP error instead of calling the service",
		Params: []Param{
			num("status", "status", 400, 599, true, 503, "HTTP status"),
			num("retry_after_ms", "ms", 0, MaxLatencyMs, true, 0, "Retry-After sent with the error (0: none; whole seconds on the wire, rounded up)"),
		},
		ops: allOps,
		decide: func(out Decision, r *Rule, _ Event, _ float64) (Decision, string) {
			out.Status, out.RetryAfter = int(r.Num("status")), ms(r.Num("retry_after_ms"))
			return out, "status=" + strconv.Itoa(out.Status) + " retry_after_ms=" + fmtNum(r.Num("retry_after_ms"))
		},
		// A crash (a panic) is an internal error to the caller; a logged "HTTP 503" says
		// which status.
		FromLog: &LogPattern{Rank: 130, Match: regexp.MustCompile(`\bHTTP [45]\d\d\b|^panic: `), Params: func(text string, samples map[string]float64) {
			samples["status"] = 500
			if m := httpRE.FindStringSubmatch(text); m != nil {
				samples["status"] = atof(m[1])
			}
			if m := retryRE.FindStringSubmatch(text); m != nil {
				samples["retry_after_ms"] = atof(m[1]) * 1000
			}
		}}},
	{Name: KindTruncate, Layer: LayerService, Pass: PassRewrite, Doc: "cuts the response body short",
		Params: []Param{{Name: "keep_fraction", Unit: "fraction", Min: 0, Max: 1, MaxOpen: true, Doc: "fraction of the body delivered"}},
		ops:    allOps,
		decide: func(out Decision, r *Rule, _ Event, _ float64) (Decision, string) {
			out.Keep = math.Min(out.Keep, r.Num("keep_fraction"))
			return out, "keep_fraction=" + strconv.FormatFloat(r.Num("keep_fraction"), 'f', 2, 64)
		},
		FromLog: &LogPattern{Rank: 100, Match: regexp.MustCompile(`(?i)prematurely closed|unexpected EOF|IncompleteRead|ChunkedEncodingError`)}},
	{Name: KindHeaderMissing, Layer: LayerService, Pass: PassRewrite, Doc: "removes a response header", Params: []Param{text("header", "header name")},
		ops: allOps,
		decide: func(out Decision, r *Rule, _ Event, _ float64) (Decision, string) {
			out.RemoveHeaders = append(out.RemoveHeaders, r.Text("header"))
			return out, "header=" + r.Text("header")
		}},
	{Name: KindHeaderGarbled, Layer: LayerService, Pass: PassRewrite, Doc: "replaces a response header's value with bytes that do not parse", Params: []Param{text("header", "header name")},
		ops: allOps,
		decide: func(out Decision, r *Rule, _ Event, _ float64) (Decision, string) {
			out.GarbleHeaders = append(out.GarbleHeaders, r.Text("header"))
			return out, "header=" + r.Text("header")
		}},
	{Name: KindBrokenGzip, Layer: LayerService, Pass: PassRewrite, Doc: "sends the body as gzip that breaks part-way (Content-Encoding: gzip)",
		ops: allOps,
		decide: func(out Decision, _ *Rule, _ Event, _ float64) (Decision, string) {
			out.BrokenGzip = true
			return out, ""
		},
		FromLog: &LogPattern{Rank: 70, Match: regexp.MustCompile(`(?i)gzip: invalid header|not in gzip format|incorrect header check|gzip: .*checksum`)}},
	{Name: KindSlowBody, Layer: LayerService, Pass: PassRewrite, Doc: "sends the body slowly, in small flushed chunks",
		Params: []Param{num("bytes_per_sec", "bytes/s", 1, maxRate, false, 0, "body throughput")},
		ops:    allOps,
		decide: func(out Decision, r *Rule, _ Event, _ float64) (Decision, string) {
			out.SlowBodyBytesPerSec = minPositive(out.SlowBodyBytesPerSec, r.Num("bytes_per_sec"))
			return out, "bytes_per_sec=" + fmtNum(r.Num("bytes_per_sec"))
		}},
	// Resources (applied through cgroup knobs and the sandbox clock by the runtimes, never
	// to one event: no ops, no decide, an ambient effect instead).
	{Name: KindMemoryLeak, Layer: LayerResource, Pass: PassAmbient, Doc: "memory available to the sandbox shrinks steadily, as if a neighbour leaked",
		Params: []Param{num("mb_per_min", "MiB/min", 0, 1e6, false, 0, "leak rate"), num("limit_mb", "MiB", 1, 1e7, false, 1024, "memory limit the leak starts from")},
		ambient: func(res Resources, r *Rule) (Resources, string) {
			res.MemoryLimitMB = minPositive(res.MemoryLimitMB, r.Num("limit_mb"))
			res.LeakMBPerMin = math.Max(res.LeakMBPerMin, r.Num("mb_per_min"))
			return res, "limit_mb=" + fmtNum(r.Num("limit_mb")) + " mb_per_min=" + fmtNum(r.Num("mb_per_min"))
		},
		FromLog: &LogPattern{Rank: 60, Match: regexp.MustCompile(`OutOfMemoryError|MemoryError|(?i)out of memory|cannot allocate memory`)}},
	{Name: KindCPUThrottle, Layer: LayerResource, Pass: PassAmbient, Doc: "caps the sandbox's CPU share (cgroup cpu.max)",
		Params: []Param{num("cpu_fraction", "fraction", 0.01, 64, false, 0, "CPUs the sandbox may use (0.5: half of one)")},
		ambient: func(res Resources, r *Rule) (Resources, string) {
			res.CPUFraction = minPositive(res.CPUFraction, r.Num("cpu_fraction"))
			return res, "cpu_fraction=" + fmtNum(r.Num("cpu_fraction"))
		}},
	{Name: KindClockSkew, Layer: LayerResource, Pass: PassAmbient, Doc: "skews the sandbox clock",
		Params: []Param{num("offset_ms", "ms", -MaxLatencyMs*24, MaxLatencyMs*24, false, 0, "constant offset"), num("drift_ppm", "ppm", -1e6, 1e6, false, 0, "rate error")},
		ambient: func(res Resources, r *Rule) (Resources, string) {
			res.ClockOffset += ms(r.Num("offset_ms"))
			res.ClockDriftPPM += r.Num("drift_ppm")
			return res, "offset_ms=" + fmtNum(r.Num("offset_ms")) + " drift_ppm=" + fmtNum(r.Num("drift_ppm"))
		},
		FromLog: &LogPattern{Rank: 110, Match: regexp.MustCompile(`(?i)clock skew`), Params: func(text string, samples map[string]float64) {
			if m := skewRE.FindStringSubmatch(text); m != nil {
				v := atof(m[1])
				if m[2] == "behind" {
					v = -v
				}
				samples["offset_ms"] = v * 1000
			}
		}}},
}

// Kinds returns the catalogue of fault kinds, each with probability as its first
// parameter. The caller must not modify the result's Params.
func Kinds() []KindInfo {
	out := make([]KindInfo, len(kinds))
	for i, k := range kinds {
		k.Params = append([]Param{ProbabilityParam}, k.Params...)
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
	k.Params = append([]Param{ProbabilityParam}, k.Params...)
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
