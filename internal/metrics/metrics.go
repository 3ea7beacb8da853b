package metrics

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

// meterName is the instrumentation scope of fencelock's instruments.
const meterName = "github.com/fencelock/fencelock"

// Attribute keys.
const (
	attrMethod  = attribute.Key("fencelock.method")  // try_acquire, acquire, try_run_locked, run_locked, try_lock, lock, semaphore_acquire, acquire_all, ...
	attrOutcome = attribute.Key("fencelock.outcome") // granted, refused, canceled, error; renewed, locked, lost, failed
	attrCause   = attribute.Key("fencelock.cause")   // trust_window_expired, gone_on_server; released, lost
)

// Method names the call a measurement is about.
type Method int

// Outcome is a call's result, a renewal's, or the cause of a lease's end.
type Outcome int

// The calls measured.
const (
	TryAcquire       Method = iota // Lessor.TryAcquire
	Acquire                        // Lessor.Acquire
	TryRunLocked                   // Lessor.TryRunLocked
	RunLocked                      // Lessor.RunLocked
	TryLock                        // advisory: TryLock (every mode and key form)
	Lock                           // advisory: Lock (every mode and key form)
	FenceTx                        // FenceTx
	LeaseFenceTx                   // Lease.FenceTx
	UpdateFencedTx                 // UpdateFencedTx
	SemaphoreTry                   // Semaphore.TryAcquire
	SemaphoreAcquire               // Semaphore.Acquire
	TryAcquireAll                  // Lessor.TryAcquireAll
	AcquireAll                     // Lessor.AcquireAll
	numMethods
)

var methodNames = [numMethods]string{"try_acquire", "acquire", "try_run_locked", "run_locked", "try_lock", "lock", "fence_tx", "lease_fence_tx", "update_fenced_tx", "semaphore_try_acquire", "semaphore_acquire", "try_acquire_all", "acquire_all"}

// The outcomes: of calls, of renewals, and the causes of ends and losses.
const (
	Granted  Outcome = iota // granted
	Refused                 // refused: held by someone else
	Canceled                // the call's ctx ended
	Error                   // any other error
	// renewals
	Renewed // renewed
	Locked  // the row was locked by a transaction; retried
	Lost    // the database no longer has the grant
	Failed  // the statement failed; retried
	// lease ends and losses
	Released           // released by its holder
	TrustWindowExpired // no renewal succeeded within the trust window
	GoneOnServer       // expired or taken over on the server
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"granted", "refused", "canceled", "error", "renewed", "locked", "lost", "failed", "released", "trust_window_expired", "gone_on_server"}

// Instruments holds the instruments of one meter provider and the attribute sets of every
// measurement, built once. Its methods are safe for concurrent use.
type Instruments struct {
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

	// The up-down counts, observed by a callback (see the package doc).
	heldN, waitingN atomic.Int64

	byCall    [numMethods][numOutcomes]metric.MeasurementOption // method and outcome
	byMethod  [numMethods]metric.MeasurementOption
	byOutcome [numOutcomes]metric.MeasurementOption // outcome, for renewals
	byCause   [numOutcomes]metric.MeasurementOption // cause, for hold times and losses
}

// durationBuckets are the histograms' bucket bounds in seconds: 100 µs to 60 s, so a hand-off
// (~1 ms), a contended wait (a TTL) and a long hold all land in a bucket of their own.
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// newInstruments creates fencelock's instruments on mp. An instrument the provider refuses is
// replaced by a no-op one (OpenTelemetry's API returns one alongside its error), so metrics
// never fail a lock; the errors are joined in the result, which the callers drop: a provider
// refuses an instrument only for a name or unit it cannot take, and these are fixed.
func newInstruments(mp metric.MeterProvider) (*Instruments, error) {
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
	ms := &Instruments{
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

// byProvider shares one set of instruments, and so one count of leases held, among the
// lessors and lockers of one provider.
var byProvider sync.Map // metric.MeterProvider -> *Instruments

// For returns the instruments of mp, made once per provider and kept for the life of the
// process, with a callback registered on mp (a provider whose dynamic type is not comparable
// cannot key the cache: it gets instruments of its own each time). An instrument the provider
// refuses records nothing. mp must not be nil.
func For(mp metric.MeterProvider) *Instruments {
	if !reflect.ValueOf(mp).Comparable() { // a struct holding a slice in an interface field: not hashable
		m, _ := newInstruments(mp)
		return m
	}
	if m, ok := byProvider.Load(mp); ok {
		return m.(*Instruments)
	}
	m, _ := newInstruments(mp) // an instrument the provider refuses records nothing
	actual, _ := byProvider.LoadOrStore(mp, m)
	return actual.(*Instruments)
}

// defaultInstruments are the instruments of the default meter provider. A no-op provider
// until SetDefault.
var defaultInstruments atomic.Pointer[Instruments]

func init() { defaultInstruments.Store(For(noop.NewMeterProvider())) }

// Default returns the instruments of the default provider: the one last given to SetDefault,
// or a no-op provider. Safe for concurrent use.
func Default() *Instruments { return defaultInstruments.Load() }

// SetDefault makes mp the default provider, for the callers of Default from now on. mp must
// not be nil. Safe for concurrent use.
func SetDefault(mp metric.MeterProvider) { defaultInstruments.Store(For(mp)) }

// buildSets fills the attribute sets of every measurement.
func (m *Instruments) buildSets() {
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

// Acquired records a call of mt that started at start and ended with outcome o (Granted,
// Refused, Canceled or Error): its duration by outcome, and a grant. An Error while ctx has
// ended counts as Canceled, whatever its cause.
func (m *Instruments) Acquired(ctx context.Context, mt Method, start time.Time, o Outcome) {
	if o == Error && ctx.Err() != nil {
		o = Canceled
	}
	ctx = context.Background()
	h := m.acquireDuration
	if mt == TryLock || mt == Lock {
		h = m.advisoryDuration
	}
	h.Record(ctx, time.Since(start).Seconds(), m.byCall[mt][o])
	if o == Granted && h == m.acquireDuration {
		m.grants.Add(ctx, 1, m.byMethod[mt])
	}
}

// Granted counts a grant of mt (a RunLocked's transaction got the row).
func (m *Instruments) Granted(mt Method) { m.grants.Add(context.Background(), 1, m.byMethod[mt]) }

// Contention counts a call of mt that found the lease held: refused, or queued.
func (m *Instruments) Contention(mt Method) {
	m.contended.Add(context.Background(), 1, m.byMethod[mt])
}

// LeaseStarted counts a lease held from now on (the held count).
func (m *Instruments) LeaseStarted() { m.heldN.Add(1) }

// LeaseEnded records the end of a lease granted at granted (local clock) with cause Released,
// TrustWindowExpired or GoneOnServer: the held count, the hold time by Released or Lost, and a
// loss by its cause.
func (m *Instruments) LeaseEnded(granted time.Time, cause Outcome) {
	ctx := context.Background()
	m.heldN.Add(-1)
	if cause == Released {
		m.holdDuration.Record(ctx, time.Since(granted).Seconds(), m.byCause[Released])
		return
	}
	m.holdDuration.Record(ctx, time.Since(granted).Seconds(), m.byCause[Lost])
	m.lost.Add(ctx, 1, m.byCause[cause])
}

// Renewed records n renewal outcomes o (Renewed, Locked, Lost, Failed) of one renewal
// statement.
func (m *Instruments) Renewed(o Outcome, n int) {
	if n > 0 {
		m.renewals.Add(context.Background(), int64(n), m.byOutcome[o])
	}
}

// Stale records a fenced write of mt rejected as stale.
func (m *Instruments) Stale(mt Method) {
	m.staleRejections.Add(context.Background(), 1, m.byMethod[mt])
}

// Queued counts a call waiting in a lease queue from now on; Dequeued, one that stopped.
func (m *Instruments) Queued() { m.waitingN.Add(1) }

// Dequeued counts a call that stopped waiting in a lease queue (see Queued).
func (m *Instruments) Dequeued() { m.waitingN.Add(-1) }

// SessionLost counts a session advisory lock lost.
func (m *Instruments) SessionLost() { m.advisoryLost.Add(context.Background(), 1) }
