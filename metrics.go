package fencelock

import (
	"context"
	"errors"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Metrics through the OpenTelemetry metric API. Instrument names and units follow
// OpenTelemetry's conventions (dotted lower-case names, durations in seconds as float
// histograms, counts without a unit). Attributes take a handful of values each (method,
// outcome, cause); lease and lock names are never attributes, since their number is unbounded.
// Every attribute set is built once, so a recording costs an atomic add or a histogram bucket
// update in the SDK, and nothing beyond an interface call with the no-op provider.

// meterName is the instrumentation scope of fencelock's instruments.
const meterName = "github.com/fencelock/fencelock"

// Attribute keys.
const (
	attrMethod  = attribute.Key("fencelock.method")  // try_acquire, acquire, try_run_locked, run_locked, try_lock, lock, semaphore_acquire, acquire_all, ...
	attrOutcome = attribute.Key("fencelock.outcome") // granted, refused, canceled, error; renewed, locked, lost, failed
	attrCause   = attribute.Key("fencelock.cause")   // trust_window_expired, gone_on_server; released, lost
)

// method names the call a measurement is about; outcome its result.
type (
	method  int
	outcome int
)

const (
	mTryAcquire method = iota
	mAcquire
	mTryRunLocked
	mRunLocked
	mTryLock // advisory: TryLock, TryLockShared, TryLockKey
	mLock    // advisory: Lock, LockShared, LockKey
	mFenceTx
	mLeaseFenceTx
	mUpdateFencedTx
	mSemaphoreTry     // Semaphore.TryAcquire
	mSemaphoreAcquire // Semaphore.Acquire
	mTryAcquireAll    // Lessor.TryAcquireAll
	mAcquireAll       // Lessor.AcquireAll
	numMethods
)

var methodNames = [numMethods]string{"try_acquire", "acquire", "try_run_locked", "run_locked", "try_lock", "lock", "fence_tx", "lease_fence_tx", "update_fenced_tx", "semaphore_try_acquire", "semaphore_acquire", "try_acquire_all", "acquire_all"}

const (
	oGranted outcome = iota
	oRefused
	oCanceled
	oError
	// renewals
	oRenewed
	oLocked
	oLost
	oFailed
	// lease ends and losses
	oReleased
	oTrustWindowExpired
	oGoneOnServer
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"granted", "refused", "canceled", "error", "renewed", "locked", "lost", "failed", "released", "trust_window_expired", "gone_on_server"}

// metrics holds the instruments of one meter provider and the attribute sets of every
// measurement, built once; its methods are safe for concurrent use.
type metrics struct {
	acquireDuration  metric.Float64Histogram
	grants           metric.Int64Counter
	contended        metric.Int64Counter
	holdDuration     metric.Float64Histogram
	held             metric.Int64ObservableUpDownCounter
	renewals         metric.Int64Counter
	lost             metric.Int64Counter
	staleRejections  metric.Int64Counter
	waiting          metric.Int64ObservableUpDownCounter
	advisoryDuration metric.Float64Histogram
	advisoryLost     metric.Int64Counter

	// The up-down counts, observed by a callback: recorded as deltas on a provider that
	// forwards only what comes after it is set up (OpenTelemetry's global one), a count would
	// go negative for a lease granted before and ended after.
	heldN, waitingN atomic.Int64

	byCall    [numMethods][numOutcomes]metric.MeasurementOption // method and outcome
	byMethod  [numMethods]metric.MeasurementOption
	byOutcome [numOutcomes]metric.MeasurementOption // outcome, for renewals
	byCause   [numOutcomes]metric.MeasurementOption // cause, for hold times and losses
}

// durationBuckets are the histograms' bucket bounds in seconds: 100 µs to 60 s, so a hand-off
// (~1 ms), a contended wait (a TTL) and a long hold all land in a bucket of their own.
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// newMetrics creates fencelock's instruments on mp. An instrument the provider refuses is
// replaced by a no-op one (OpenTelemetry's API returns one alongside its error), so metrics
// never fail a lock; the errors are joined in the result, which the callers drop: a provider
// refuses an instrument only for a name or unit it cannot take, and these are fixed.
func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	m := mp.Meter(meterName)
	var errs []error
	f := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(durationBuckets...))
		errs = append(errs, err)
		return h
	}
	c := func(name, unit, desc string) metric.Int64Counter {
		h, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return h
	}
	u := func(name, unit, desc string) metric.Int64ObservableUpDownCounter {
		h, err := m.Int64ObservableUpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return h
	}
	ms := &metrics{
		acquireDuration:  f("fencelock.lease.acquire.duration", "Time from the call of TryAcquire or Acquire to its return, by method and outcome (granted, refused, canceled, error)."),
		grants:           c("fencelock.lease.grants", "{grant}", "Grants: TTL leases granted and RunLocked transactions that got the lease row, by method."),
		contended:        c("fencelock.lease.contended", "{call}", "Calls that found the lease held by someone else: try calls refused, and waiting calls that had to queue, by method."),
		holdDuration:     f("fencelock.lease.hold.duration", "Time a lease was held, from its grant to its end, by cause (released, lost)."),
		held:             u("fencelock.lease.held", "{lease}", "Leases held by this process now."),
		renewals:         c("fencelock.lease.renewals", "{renewal}", "Lease renewals by outcome: renewed, locked (row locked by a transaction; retried), lost (gone on the server), failed (statement error; retried)."),
		lost:             c("fencelock.lease.lost", "{lease}", "Leases lost, by cause: trust_window_expired (no renewal succeeded in time), gone_on_server (expired or taken over on the server)."),
		staleRejections:  c("fencelock.fence.stale_rejections", "{write}", "Fenced writes rejected for a stale fencing token, by method (fence_tx, lease_fence_tx, update_fenced_tx)."),
		waiting:          u("fencelock.lease.queue.waiting", "{call}", "Calls of this process waiting in a lease's queue now (Acquire, RunLocked until its transaction gets the row)."),
		advisoryDuration: f("fencelock.advisory.acquire.duration", "Time from the call of a session advisory lock method to its return, by method and outcome."),
		advisoryLost:     c("fencelock.advisory.sessions_lost", "{session}", "Session advisory locks lost because their session ended or changed."),
	}
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(ms.held, ms.heldN.Load())
		o.ObserveInt64(ms.waiting, ms.waitingN.Load())
		return nil
	}, ms.held, ms.waiting)
	errs = append(errs, err)
	ms.buildSets()
	return ms, errors.Join(errs...)
}

// metricsByProvider shares one set of instruments, and so one count of leases held, among the
// lessors and lockers of one provider.
var metricsByProvider sync.Map // metric.MeterProvider -> *metrics

// metricsFor returns the instruments of mp, made once per provider (a provider whose dynamic
// type is not comparable cannot key the map: it gets instruments of its own each time).
func metricsFor(mp metric.MeterProvider) *metrics {
	if !reflect.ValueOf(mp).Comparable() { // a struct holding a slice in an interface field: not hashable
		m, _ := newMetrics(mp)
		return m
	}
	if m, ok := metricsByProvider.Load(mp); ok {
		return m.(*metrics)
	}
	m, _ := newMetrics(mp) // an instrument the provider refuses records nothing
	actual, _ := metricsByProvider.LoadOrStore(mp, m)
	return actual.(*metrics)
}

// buildSets fills the attribute sets of every measurement.
func (m *metrics) buildSets() {
	set := func(kvs ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(kvs...))
	}
	for mt := range numMethods {
		m.byMethod[mt] = set(attrMethod.String(methodNames[mt]))
		for o := range numOutcomes {
			m.byCall[mt][o] = set(attrMethod.String(methodNames[mt]), attrOutcome.String(outcomeNames[o]))
		}
	}
	for o := range numOutcomes {
		m.byOutcome[o] = set(attrOutcome.String(outcomeNames[o]))
		m.byCause[o] = set(attrCause.String(outcomeNames[o]))
	}
}

// outcomeOf classifies a call's error for the outcome attribute.
func outcomeOf(err error) outcome {
	switch {
	case err == nil:
		return oGranted
	case errors.Is(err, ErrNotAcquired), errors.Is(err, errRefused):
		return oRefused
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return oCanceled
	}
	return oError
}

// acquired records a call of mt that started at start and returned err: its duration by
// outcome, and a grant. An error while ctx has ended is a cancellation, whatever its cause.
func (m *metrics) acquired(ctx context.Context, mt method, start time.Time, err error) {
	o := outcomeOf(err)
	if o == oError && ctx.Err() != nil {
		o = oCanceled
	}
	ctx = context.Background()
	h := m.acquireDuration
	if mt == mTryLock || mt == mLock {
		h = m.advisoryDuration
	}
	h.Record(ctx, time.Since(start).Seconds(), m.byCall[mt][o])
	if o == oGranted && h == m.acquireDuration {
		m.grants.Add(ctx, 1, m.byMethod[mt])
	}
}

// granted counts a grant of mt (a RunLocked's transaction got the row).
func (m *metrics) granted(mt method) { m.grants.Add(context.Background(), 1, m.byMethod[mt]) }

// contention counts a call of mt that found the lease held: refused, or queued.
func (m *metrics) contention(mt method) {
	m.contended.Add(context.Background(), 1, m.byMethod[mt])
}

// leaseStarted and leaseEnded track a lease's life: the held gauge, the hold time by how it
// ended, and losses by cause.
func (m *metrics) leaseStarted() { m.heldN.Add(1) }

func (m *metrics) leaseEnded(granted time.Time, err error) {
	ctx := context.Background()
	m.heldN.Add(-1)
	if errors.Is(err, ErrReleased) {
		m.holdDuration.Record(ctx, time.Since(granted).Seconds(), m.byCause[oReleased])
		return
	}
	m.holdDuration.Record(ctx, time.Since(granted).Seconds(), m.byCause[oLost])
	cause := oGoneOnServer
	if errors.Is(err, ErrTrustWindowExpired) {
		cause = oTrustWindowExpired
	}
	m.lost.Add(ctx, 1, m.byCause[cause])
}

// renewed records n renewal outcomes o of one renewal statement.
func (m *metrics) renewed(o outcome, n int) {
	if n > 0 {
		m.renewals.Add(context.Background(), int64(n), m.byOutcome[o])
	}
}

// stale records a fenced write of mt rejected as stale.
func (m *metrics) stale(mt method) {
	m.staleRejections.Add(context.Background(), 1, m.byMethod[mt])
}

// queued and dequeued track the calls waiting in a lease queue.
func (m *metrics) queued()   { m.waitingN.Add(1) }
func (m *metrics) dequeued() { m.waitingN.Add(-1) }

// sessionLost counts a session advisory lock lost.
func (m *metrics) sessionLost() { m.advisoryLost.Add(context.Background(), 1) }

// defaultMetrics are the instruments of the default meter provider: of the constructors given
// no [WithMeterProvider], and of the calls that take no lessor or locker ([FenceTx],
// [UpdateFencedTx]). A no-op provider until [SetDefaultMeterProvider].
var defaultMetrics atomic.Pointer[metrics]

func init() { defaultMetrics.Store(metricsFor(noop.NewMeterProvider())) }
