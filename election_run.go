package fencelock

import (
	"context"
	"errors"
	"time"
)

// ElectionCallbacks are what [Election.Run] calls. Each may be nil.
type ElectionCallbacks struct {
	// OnStartedLeading runs the leader's work, in Run's goroutine, when this candidate is
	// elected. ctx is the term's context ([Term.Context]): it ends, with the term's error as
	// cause, when the term is lost, and when Run's ctx ends. When it returns, Run resigns the
	// term (handing it to the next candidate) and campaigns again: unlike client-go's
	// OnStartedLeading, it must not return while its work goes on in another goroutine. A panic
	// in it resigns the term too, and goes on.
	OnStartedLeading func(ctx context.Context, term *Term)
	// OnStoppedLeading is called after each term of this candidate has ended, with the term's
	// error ([ErrReleased] after a resign, a [*LeaseLostError] after a loss).
	OnStoppedLeading func(term *Term, err error)
	// OnNewLeader is called, from a goroutine of its own, with each state of the election as
	// [Election.Observe] delivers it, this candidate's terms included; not concurrently.
	OnNewLeader func(LeaderInfo)
}

// Run campaigns with value until ctx ends: elected, it calls OnStartedLeading with the term's
// context; when that returns (the term lost, ctx ended, or the work done) it resigns the term,
// calls OnStoppedLeading and campaigns again. OnNewLeader, if set, observes the election
// throughout. Campaign failures other than ctx's end (a connection lost, say) are retried with
// the lessor's [Backoff].
//
// It returns ctx's error once ctx has ended and the last term has been resigned (a term won
// just as ctx ended included); an [*ArgumentError] at once for a bad value (see
// [Election.Campaign]); an error wrapping [ErrAlreadyHeld] when its lessor holds or campaigns for
// the term already. Safe for concurrent use; each call is one
// candidate of its lessor (a lessor holds one term of a name at a time: run one Run per
// lessor and election).
//
// The shape is client-go's leaderelection.RunOrDie (OnStartedLeading, OnStoppedLeading,
// OnNewLeader), with fenced terms.
func (e *Election) Run(ctx context.Context, value string, cb ElectionCallbacks) error {
	if err := validateLeaderValue(value); err != nil {
		return err
	}
	observed := make(chan struct{})
	if cb.OnNewLeader != nil {
		octx, stop := context.WithCancel(ctx)
		defer func() { stop(); <-observed }()
		go func() {
			defer close(observed)
			for info := range e.Observe(octx) {
				cb.OnNewLeader(info)
			}
		}()
	} else {
		close(observed)
	}
	for n := 0; ; n++ {
		term, err := e.Campaign(ctx, value)
		if err == nil && ctx.Err() != nil {
			e.lead(ctx, term, cb) // elected as ctx ended: resigned at once, OnStoppedLeading told
			return ctx.Err()
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			if errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrAlreadyHeld) {
				return err
			}
			e.lessor.cfg.common.logger.Warn("fencelock: campaign failed; retrying", "election", e.name, "error", err)
			t := time.NewTimer(e.lessor.cfg.backoff(n))
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			continue
		}
		n = -1
		e.lead(ctx, term, cb)
	}
}

// lead runs a term won by Run: OnStartedLeading under the term's context (not when ctx has
// ended already), then, whatever happened (a panic in it included: it goes on afterwards), the
// resign and OnStoppedLeading.
func (e *Election) lead(ctx context.Context, term *Term, cb ElectionCallbacks) {
	tctx, cancel := term.Context(ctx)
	defer func() {
		cancel()
		rctx, stop := detached(ctx, cleanupTimeout)
		_ = term.Resign(rctx) // ErrNotHeld after a loss; else expires by its TTL
		stop()
		if cb.OnStoppedLeading != nil {
			cb.OnStoppedLeading(term, term.Err())
		}
	}()
	if cb.OnStartedLeading != nil && ctx.Err() == nil {
		cb.OnStartedLeading(tctx, term)
	}
}
