// Package threats shares what one sandbox learned about dangerous behaviour with every
// process that plays episodes: a threat fingerprint is made when a step's safety events
// include one the runtimes or the workspace tools record for an attack (a hostile
// syscall refused, egress refused, a decoy host device opened, a path escaping the
// workspace, a link or special file), published once in the gauntlet_threats KV bucket,
// and watched by every player, so that a later step anywhere whose action matches it (any
// episode, any run, any worker) is flagged at once with the safety event
// "threat_fingerprint: ..." (EventMatch), which a reward spec's `fingerprint` detector
// penalises.
//
// A fingerprint is keyed by its normalised command alone (Normalise: the tool and, for
// shell.exec, the command line with quotes dropped, blanks folded and numbers replaced by
// N; for the file tools, the cleaned path; for any other tool, its arguments so
// normalised), because that is what a later step can be compared with before anything
// runs: a match needs no sandbox, so it is flagged even where the attack was not tried
// for real (an injected fault answered the call, a runtime without the seccomp
// supervisor). The syscall and path pattern the sandbox recorded (Event) travel with it,
// for whoever reads the flag: what the command did the first time.
//
// Ownership and concurrency: a Watcher owns its watch of the bucket and the publisher
// goroutine; Match and Record are safe for concurrent use and never block. The set of
// known fingerprints is an immutable Set behind an atomic pointer, replaced whole on each
// update, so a step reads it without a lock, and reads nil, with no allocation, while
// nothing is known. A fingerprint is never deleted by gauntlet: purge the bucket's key to
// forget one (every watcher drops it).
package threats
