package job

import (
	"time"

	"github.com/fencelock/fencelock/internal/validate"
)

// config is a Job's configuration.
type config struct {
	wait         bool          // overlap policy: wait for a run in progress (else skip)
	holdAtLeast  time.Duration // hold the lease at least this long after a run starts
	retryCrashed bool
	retryFailed  bool
}

// Option configures a [Job]; [New] takes them. Each is validated by the constructor, which
// fails with an [*fencelock.ArgumentError] on a bad one (a nil one included). An option of
// another constructor ([fencelock.LessorOption], [fencelock.AdvisoryOption]) does not compile
// here. An option is an immutable value: one may be passed to any number of constructors, from
// any goroutine.
type Option interface {
	applyJob(*config) error
}

// option is an [Option].
type option func(*config) error

func (o option) applyJob(c *config) error { return o(c) }

// applyAll applies opts to c, in order, and stops at the first error; a nil option is refused
// with an [*fencelock.ArgumentError].
func applyAll(opts []Option, c *config) error {
	for _, o := range opts {
		if o == nil {
			return validate.Errorf("option", "must not be nil")
		}
		if err := o.applyJob(c); err != nil {
			return err
		}
	}
	return nil
}

// WithOverlapWait makes a run of a slot wait while another run of the job holds the job's
// lease (in the lease's queue), then run the slot unless the ledger has it. Default: skip (the
// slot is not run by this replica; if the run in progress is of another slot, this slot is
// missed unless a later RunSlot of it finds the lease free).
func WithOverlapWait() Option {
	return option(func(c *config) error { c.wait = true; return nil })
}

// WithHoldAtLeast keeps the job's lease for at least d (a time.Duration >= 0) after a run started,
// even when the run finishes sooner, as ShedLock's lockAtLeastFor: replicas whose clocks lag
// the database's find the lease held instead of racing for a slot that was just run. The
// ledger already keeps a slot from running twice; this keeps runs of the job apart in time.
// The hold ends early when the lease is lost or the run's ctx ends; a d above the TTL holds
// as long as the heartbeat renews the lease. A negative d makes [New] fail with an
// [*fencelock.ArgumentError]. Default: 0.
func WithHoldAtLeast(d time.Duration) Option {
	return option(func(c *config) error {
		if d < 0 {
			return validate.Errorf("WithHoldAtLeast", "is %v; it must be >= 0", d)
		}
		c.holdAtLeast = d
		return nil
	})
}

// WithRetryCrashed runs a slot again whose run crashed (unfinished, under a grant that has
// ended), when a replica next runs that slot. The crashed run may be merely paused and still
// executing: only its fenced writes are safe against the retry. Default: a crashed slot is not
// run again.
func WithRetryCrashed() Option {
	return option(func(c *config) error { c.retryCrashed = true; return nil })
}

// WithRetryFailed runs a slot again whose run failed (its function returned an error), when a
// replica next runs that slot. Default: a failed slot is not run again.
func WithRetryFailed() Option {
	return option(func(c *config) error { c.retryFailed = true; return nil })
}
