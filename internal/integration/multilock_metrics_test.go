package integration

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// AcquireAll waits for a held member to be released (or to expire), then gets the whole set;
// a ctx that ends first leaves nothing held.
func TestMultiLockAcquireWaits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := newLessor(t, b.Pool, "mlw-a")
	r := newMetricsReader(t)
	c := newLessor(t, b.Pool, "mlw-c", fastBackoff, fencelock.WithMeterProvider(r.mp))
	held, err := a.TryAcquire(b.Ctx, "mlw:2", 10*time.Second)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(b.Ctx, 100*time.Millisecond)
	defer cancel()
	_, err = c.AcquireAll(ctx, []string{"mlw:1", "mlw:2"}, time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	var n int
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT count(*) FROM fencelock.leases WHERE holder = 'mlw-c' AND expires_at > clock_timestamp()`).Scan(&n))
	require.Zero(t, n, "nothing held after a cancelled wait")
	got := make(chan *fencelock.LeaseSet, 1)
	go func() {
		set, err := c.AcquireAll(b.Ctx, []string{"mlw:2", "mlw:1"}, time.Second)
		if err == nil {
			got <- set
		}
	}()
	// The wait was refused at least once (it counts as contended) before the release.
	waitFor(t, b, "AcquireAll refused while mlw:2 is held", func() bool {
		return r.value("fencelock.lease.contended", method("acquire_all")) == 2 // the cancelled wait's and this one's
	})
	require.NoError(t, held.Release(b.Ctx))
	select {
	case set := <-got:
		require.NoError(t, set.Release(b.Ctx))
	case <-time.After(5 * time.Second):
		t.Fatal("AcquireAll did not get the set after the release")
	}
}
