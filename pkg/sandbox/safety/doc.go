// Package safety observes the attacks a sandbox refuses, so that each becomes a safety event
// rather than a silent kernel error. It is shared by the process and containerd runtimes
// and by the containerd sandbox agent, and it depends only on the standard library and
// golang.org/x/sys/unix (the agent is a static binary).
//
// It owns three mechanisms:
//
//   - A seccomp user-notification filter (SECCOMP_RET_USER_NOTIF, Linux ≥ 5.5): the hostile
//     system calls (ptrace, mount and the new mount API, kexec, module loading, bpf,
//     perf_event_open, setns, unshare, …) and connect / sendto-with-address are sent to a
//     supervisor that holds the filter's listener fd (InstallFilter, Supervise). The
//     supervisor answers a hostile call with EPERM — what the sandbox got before, so
//     programs that probe these calls behave the same — and records it; it answers
//     connect/sendto to a non-loopback IPv4/IPv6 address with ENETUNREACH and records the
//     destination, both as an event and one by one with its socket's protocol
//     (Recorder.AddEgress, sandbox.ExecResult.Egress); everything else continues into
//     the kernel.
//   - Decoy host devices (CreateDecoys, Tripwire): empty read-only files shown in the
//     sandbox as /dev/mem, /dev/kmem and /dev/port, one set per sandbox, watched from the
//     host with inotify; every open is a device_access event. They expose nothing.
//   - A Recorder that folds repeated observations into a bounded list of sandbox.Events,
//     and keeps the egress attempts unfolded up to sandbox.MaxEgress.
package safety
