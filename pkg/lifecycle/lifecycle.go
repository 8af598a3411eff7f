// Package lifecycle gives every long-running part of gauntlet the same three phases, in the
// spirit of dskit's services: starting (connect, create streams, migrate), running (serve
// until asked to stop or until failing) and stopping (drain and release, within a deadline).
//
// Constructors only allocate; all I/O happens in Starting. Running returns nil when its
// context is cancelled (a normal stop) and an error when the service fails, which stops the
// whole process cleanly. Stopping is called once, after Running has returned or Starting
// failed, and must finish before its context's deadline.
package lifecycle

import "context"

// Service is a long-running part of a gauntlet process.
type Service interface {
	// Starting prepares the service; when it returns nil the service is ready.
	Starting(ctx context.Context) error
	// Running serves until ctx is cancelled (return nil) or the service fails.
	Running(ctx context.Context) error
	// Stopping releases what Starting acquired. It is called even if Starting failed
	// half-way, so it must tolerate partial state.
	Stopping(ctx context.Context) error
}

// Readier is a Service that can be running yet unable to do its work for a while (a
// child server it supervises died and is being restarted). Ready is nil when it can,
// else says why not; it must be cheap and safe to call from any goroutine, as readiness
// checks call it on every probe.
type Readier interface {
	Ready() error
}

// Funcs adapts functions to a Service (and a Readier); nil functions do nothing (a nil
// Running waits for the stop, a nil Ready is always ready).
type Funcs struct {
	OnStarting func(ctx context.Context) error
	OnRunning  func(ctx context.Context) error
	OnStopping func(ctx context.Context) error
	OnReady    func() error
}

// Starting calls OnStarting.
func (f Funcs) Starting(ctx context.Context) error {
	if f.OnStarting == nil {
		return nil
	}
	return f.OnStarting(ctx)
}

// Running calls OnRunning, or waits for ctx when it is nil.
func (f Funcs) Running(ctx context.Context) error {
	if f.OnRunning == nil {
		<-ctx.Done()
		return nil
	}
	return f.OnRunning(ctx)
}

// Stopping calls OnStopping.
func (f Funcs) Stopping(ctx context.Context) error {
	if f.OnStopping == nil {
		return nil
	}
	return f.OnStopping(ctx)
}

// Ready calls OnReady.
func (f Funcs) Ready() error {
	if f.OnReady == nil {
		return nil
	}
	return f.OnReady()
}
