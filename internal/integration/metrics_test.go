package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fencelock/fencelock"
	"github.com/fencelock/fencelock/internal/testkit"
)

// metricsReader collects what a lessor or locker recorded on an SDK provider with a manual
// reader.
type metricsReader struct {
	t      *testing.T
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newMetricsReader(t *testing.T) *metricsReader {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &metricsReader{t: t, reader: reader, mp: mp}
}

// value returns the sum of the data points of instrument name whose attributes include attrs:
// a counter's or up-down counter's value, a histogram's count. A missing instrument is 0.
func (r *metricsReader) value(name string, attrs ...attribute.KeyValue) int64 {
	r.t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(r.t, r.reader.Collect(context.Background(), &rm))
	var total int64
	match := func(set attribute.Set) bool {
		for _, kv := range attrs {
			if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
				return false
			}
		}
		return true
	}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(r.t, "github.com/fencelock/fencelock", sm.Scope.Name)
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				require.Equal(r.t, "s", m.Unit, "%s: durations are in seconds", name)
				for _, p := range d.DataPoints {
					if match(p.Attributes) {
						total += int64(p.Count)
					}
				}
			default:
				r.t.Fatalf("%s: unexpected data %T", name, m.Data)
			}
		}
	}
	return total
}

func method(v string) attribute.KeyValue  { return attribute.String("fencelock.method", v) }
func outcome(v string) attribute.KeyValue { return attribute.String("fencelock.outcome", v) }
func cause(v string) attribute.KeyValue   { return attribute.String("fencelock.cause", v) }

// Each instrument counts what it says, on a real server: grants and refusals, a queued wait
// handed the lease, renewals, a stale fenced write, a lease lost to its trust window, hold
// times by how leases ended, and advisory grants, refusals and a lost session.
func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newMetricsReader(t)
	withMP := fencelock.WithMeterProvider(r.mp)
	a := newLessor(t, b.Pool, "metrics-a", withMP)
	o := newLessor(t, b.Pool, "metrics-b", withMP)

	lease, err := a.TryAcquire(b.Ctx, "m", 5*time.Second)
	require.NoError(t, err)
	_, err = o.TryAcquire(b.Ctx, "m", 5*time.Second)
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	require.EqualValues(t, 1, r.value("fencelock.lease.acquire.duration", method("try_acquire"), outcome("granted")))
	require.EqualValues(t, 1, r.value("fencelock.lease.acquire.duration", method("try_acquire"), outcome("refused")))
	require.EqualValues(t, 1, r.value("fencelock.lease.grants", method("try_acquire")))
	require.EqualValues(t, 1, r.value("fencelock.lease.contended", method("try_acquire")))
	require.EqualValues(t, 1, r.value("fencelock.lease.held"))

	// A waiter queues, then is handed the lease by the release.
	got := make(chan *fencelock.Lease, 1)
	go func() {
		l, err := o.Acquire(b.Ctx, "m", 5*time.Second)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitFor(t, b, "the waiter is queued", func() bool { return r.value("fencelock.lease.queue.waiting") == 1 })
	require.EqualValues(t, 1, r.value("fencelock.lease.contended", method("acquire")))
	require.NoError(t, lease.Renew(b.Ctx))
	require.EqualValues(t, 1, r.value("fencelock.lease.renewals", outcome("renewed")))
	require.NoError(t, lease.Release(b.Ctx))
	handed := <-got
	require.NotNil(t, handed)
	require.EqualValues(t, 0, r.value("fencelock.lease.queue.waiting"))
	require.EqualValues(t, 1, r.value("fencelock.lease.acquire.duration", method("acquire"), outcome("granted")))
	require.EqualValues(t, 1, r.value("fencelock.lease.hold.duration", cause("released")))
	require.EqualValues(t, 1, r.value("fencelock.lease.held"), "one released, one handed over")

	// A fenced write with a token older than the resource's high-water mark: a later grant's
	// (a made-up one is refused: ErrTokenNotIssued), by a lessor this test's meter does not see.
	later, err := newLessor(t, b.Pool, "metrics-later").TryAcquire(b.Ctx, "m-later", 5*time.Second)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		return fencelock.FenceTx(b.Ctx, tx, "m-resource", later.Token())
	}))
	require.NoError(t, later.Release(b.Ctx))
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return handed.FenceTx(b.Ctx, tx, "m-resource") })
	require.ErrorIs(t, err, fencelock.ErrStaleToken)
	require.EqualValues(t, 1, r.value("fencelock.fence.stale_rejections", method("lease_fence_tx")))
	require.NoError(t, handed.Release(b.Ctx))

	// A lease without heartbeat is lost when its trust window ends.
	z := newLessor(t, b.Pool, "metrics-z", withMP, fencelock.WithoutHeartbeat())
	zl, err := z.TryAcquire(b.Ctx, "z", time.Second)
	require.NoError(t, err)
	select {
	case <-zl.Done():
	case <-b.Ctx.Done():
		t.Fatal("the lease without heartbeat never ended")
	}
	require.EqualValues(t, 1, r.value("fencelock.lease.lost", cause("trust_window_expired")))
	require.EqualValues(t, 1, r.value("fencelock.lease.hold.duration", cause("lost")))
	require.EqualValues(t, 2, r.value("fencelock.lease.hold.duration", cause("released")))
	require.EqualValues(t, 0, r.value("fencelock.lease.held"))
	require.EqualValues(t, 0, r.value("fencelock.lease.queue.waiting"))

	// RunLocked grants; a RunLocked that queued counts as waiting until its transaction has
	// the row, not while its fn runs.
	require.NoError(t, a.RunLocked(b.Ctx, "tx", func(context.Context, pgx.Tx, fencelock.Token) error { return nil }))
	require.EqualValues(t, 1, r.value("fencelock.lease.grants", method("run_locked")))
	blocker, err := a.TryAcquire(b.Ctx, "rq", 5*time.Second)
	require.NoError(t, err)
	inFn := make(chan int64, 1)
	ran := make(chan error, 1)
	go func() {
		ran <- o.RunLocked(b.Ctx, "rq", func(context.Context, pgx.Tx, fencelock.Token) error {
			inFn <- r.value("fencelock.lease.queue.waiting")
			return nil
		})
	}()
	waitFor(t, b, "the RunLocked is queued", func() bool { return r.value("fencelock.lease.queue.waiting") == 1 })
	require.NoError(t, blocker.Release(b.Ctx))
	require.EqualValues(t, 0, <-inFn, "waiting while its fn runs")
	require.NoError(t, <-ran)
	require.EqualValues(t, 1, r.value("fencelock.lease.contended", method("run_locked")))

	// Advisory locks: a grant, a refusal, a session lost.
	lk := newLocker(t, b.Pool, withMP, fencelock.WithWatchdogInterval(time.Second))
	other := newLocker(t, b.Pool, withMP)
	held, err := lk.TryLock(b.Ctx, "adv")
	require.NoError(t, err)
	_, err = other.TryLock(b.Ctx, "adv")
	require.ErrorIs(t, err, fencelock.ErrNotAcquired)
	require.EqualValues(t, 1, r.value("fencelock.advisory.acquire.duration", method("try_lock"), outcome("granted")))
	require.EqualValues(t, 1, r.value("fencelock.advisory.acquire.duration", method("try_lock"), outcome("refused")))
	require.NoError(t, b.DB.Server.TerminateBackend(b.Ctx, held.BackendPID()))
	select {
	case <-held.Done():
	case <-b.Ctx.Done():
		t.Fatal("the lost session was never noticed")
	}
	require.EqualValues(t, 1, r.value("fencelock.advisory.sessions_lost"))
}

// waitFor polls cond every 5 ms until it holds, failing the test when b's context ends first.
func waitFor(t *testing.T, b *bundle, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, b.Ctx, what, cond)
}

// FenceTx and UpdateFencedTx take no lessor: their stale rejections go to the default provider
// (SetDefaultMeterProvider), as do the lessors made after it is set without WithMeterProvider;
// those made before keep theirs. Not parallel: it sets the package's default.
func TestMetricsDefaultProvider(t *testing.T) {
	b := setup(t)
	r := newMetricsReader(t)
	require.ErrorIs(t, fencelock.SetDefaultMeterProvider(nil), fencelock.ErrInvalidArgument)
	before := newLessor(t, b.Pool, "metrics-before")
	require.NoError(t, fencelock.SetDefaultMeterProvider(r.mp))
	t.Cleanup(func() { require.NoError(t, fencelock.SetDefaultMeterProvider(noop.NewMeterProvider())) })
	after := newLessor(t, b.Pool, "metrics-after")
	lb, err := before.TryAcquire(b.Ctx, "before", time.Minute)
	require.NoError(t, err)
	la, err := after.TryAcquire(b.Ctx, "after", time.Minute)
	require.NoError(t, err)
	require.EqualValues(t, 1, r.value("fencelock.lease.held"), "only the lessor made after the default was set records on it")
	require.NoError(t, lb.Release(b.Ctx))
	require.NoError(t, la.Release(b.Ctx))
	require.EqualValues(t, 0, r.value("fencelock.lease.held"))
	_, err = b.Pool.Exec(b.Ctx, `CREATE TABLE stock (sku text PRIMARY KEY, n int NOT NULL, tok bigint)`+
		`; INSERT INTO stock VALUES ('A-1', 5, 9)`)
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return fencelock.FenceTx(b.Ctx, tx, "g", 9) }))
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error { return fencelock.FenceTx(b.Ctx, tx, "g", 8) })
	require.ErrorIs(t, err, fencelock.ErrStaleToken)
	err = pgx.BeginFunc(b.Ctx, b.Pool, func(tx pgx.Tx) error {
		_, err := fencelock.UpdateFencedTx(b.Ctx, tx, pgx.Identifier{"stock"}, "tok", 8,
			[]fencelock.Column{{Name: "n", Value: 4}}, []fencelock.Column{{Name: "sku", Value: "A-1"}})
		return err
	})
	require.ErrorIs(t, err, fencelock.ErrStaleToken)
	require.EqualValues(t, 1, r.value("fencelock.fence.stale_rejections", method("fence_tx")))
	require.EqualValues(t, 1, r.value("fencelock.fence.stale_rejections", method("update_fenced_tx")))
}
