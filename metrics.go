package fencelock

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/metric"

	imetrics "github.com/fencelock/fencelock/internal/metrics"
)

// The root's face of internal/metrics (its recorder type, metrics, is config.go's) (the OpenTelemetry instruments, their attribute sets,
// one set per provider, the default provider): the methods measured, and the classification
// of the root's errors into outcomes and causes, which that package does not know.

// method names the call a measurement is about; outcome its result.
type (
	method  = imetrics.Method
	outcome = imetrics.Outcome
)

const (
	mTryAcquire       = imetrics.TryAcquire
	mAcquire          = imetrics.Acquire
	mTryRunLocked     = imetrics.TryRunLocked
	mRunLocked        = imetrics.RunLocked
	mTryLock          = imetrics.TryLock // advisory: TryLock (every mode and key form)
	mLock             = imetrics.Lock    // advisory: Lock (every mode and key form)
	mFenceTx          = imetrics.FenceTx
	mLeaseFenceTx     = imetrics.LeaseFenceTx
	mUpdateFencedTx   = imetrics.UpdateFencedTx
	mSemaphoreTry     = imetrics.SemaphoreTry
	mSemaphoreAcquire = imetrics.SemaphoreAcquire
	mTryAcquireAll    = imetrics.TryAcquireAll
	mAcquireAll       = imetrics.AcquireAll

	oRenewed = imetrics.Renewed
	oLocked  = imetrics.Locked
	oLost    = imetrics.Lost
	oFailed  = imetrics.Failed
)

// metricsFor returns the recorder of mp's instruments, made once per provider.
func metricsFor(mp metric.MeterProvider) *metrics { return &metrics{imetrics.For(mp)} }

// outcomeOf classifies a call's error for the outcome attribute.
func outcomeOf(err error) outcome {
	switch {
	case err == nil:
		return imetrics.Granted
	case errors.Is(err, ErrNotAcquired), errors.Is(err, errRefused):
		return imetrics.Refused
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return imetrics.Canceled
	}
	return imetrics.Error
}

// endCause classifies how a lease ended: released, or lost by its trust window or on the
// server.
func endCause(err error) outcome {
	switch {
	case errors.Is(err, ErrReleased):
		return imetrics.Released
	case errors.Is(err, ErrTrustWindowExpired):
		return imetrics.TrustWindowExpired
	}
	return imetrics.GoneOnServer
}

// acquired records a call of mt that started at start and returned err: its duration by
// outcome, and a grant. An error while ctx has ended is a cancellation, whatever its cause.
func (m *metrics) acquired(ctx context.Context, mt method, start time.Time, err error) {
	m.in.Acquired(ctx, mt, start, outcomeOf(err))
}

// granted counts a grant of mt (a RunLocked's transaction got the row).
func (m *metrics) granted(mt method) { m.in.Granted(mt) }

// contention counts a call of mt that found the lease held: refused, or queued.
func (m *metrics) contention(mt method) { m.in.Contention(mt) }

// leaseStarted and leaseEnded track a lease's life: the held gauge, the hold time by how it
// ended, and losses by cause.
func (m *metrics) leaseStarted() { m.in.LeaseStarted() }

func (m *metrics) leaseEnded(granted time.Time, err error) { m.in.LeaseEnded(granted, endCause(err)) }

// renewed records n renewal outcomes o of one renewal statement.
func (m *metrics) renewed(o outcome, n int) { m.in.Renewed(o, n) }

// stale records a fenced write of mt rejected as stale.
func (m *metrics) stale(mt method) { m.in.Stale(mt) }

// queued and dequeued track the calls waiting in a lease queue.
func (m *metrics) queued()   { m.in.Queued() }
func (m *metrics) dequeued() { m.in.Dequeued() }

// sessionLost counts a session advisory lock lost.
func (m *metrics) sessionLost() { m.in.SessionLost() }
