// Package errkind is gauntlet's one small set of error kinds, after upspin's errors.Kind:
// invalid, not found, unavailable, internal. A service that answers over NATS puts its
// error's kind beside the text (gauntletv1.ErrorKind, Reply); the caller gets an error of
// the same kind back (FromReply) and decides by the kind alone (Of, Is): refuse what is
// invalid, retry with backoff what is unavailable. The kinds are mapped to other systems'
// codes only at gauntlet's edges: connect codes in the env API, Temporal's non-retryable
// application errors in workflows. Nothing reads an error's text to decide.
//
// Apart from its kind, an error that ends an episode as an infra error may say what failed
// (Infra, InfraOf: the model endpoint, the sandbox, the verifier, gauntlet), which the
// episode's end records (EpisodeEnded.infra_kind).
//
// Everything here is a value or a pure function, safe for concurrent use.
package errkind
