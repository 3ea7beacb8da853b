package metrics

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// unhashable is a provider whose dynamic type cannot key a map.
type unhashable struct {
	noop.MeterProvider
	_ []int
}

// One provider gets one set of instruments, shared by every caller, so the held count is one
// count; a provider that cannot key the cache gets a set of its own each time.
func TestForSharesPerProvider(t *testing.T) {
	mp := noop.NewMeterProvider()
	require.Same(t, For(mp), For(mp))
	var u metric.MeterProvider = unhashable{}
	require.NotSame(t, For(u), For(u))
}

// The default provider's instruments follow SetDefault.
func TestDefault(t *testing.T) {
	before := Default()
	require.NotNil(t, before)
	mp := unhashable{}
	SetDefault(mp)
	t.Cleanup(func() { defaultInstruments.Store(before) })
	require.NotSame(t, before, Default())
}

// Every method and outcome has its name and attribute sets, and the counts of what is held
// and waiting follow their feeds.
func TestSetsAndCounts(t *testing.T) {
	for _, n := range methodNames {
		require.NotEmpty(t, n)
	}
	for _, n := range outcomeNames {
		require.NotEmpty(t, n)
	}
	m, err := newInstruments(noop.NewMeterProvider())
	require.NoError(t, err)
	for mt := range numMethods {
		require.NotNil(t, m.byMethod[mt])
		for o := range numOutcomes {
			require.NotNil(t, m.byCall[mt][o])
		}
	}
	m.LeaseStarted()
	m.LeaseStarted()
	m.LeaseEnded(time.Now(), Released)
	m.Queued()
	require.Equal(t, int64(1), m.heldN.Load())
	require.Equal(t, int64(1), m.waitingN.Load())
	m.LeaseEnded(time.Now(), TrustWindowExpired)
	m.Dequeued()
	require.Zero(t, m.heldN.Load())
	require.Zero(t, m.waitingN.Load())
	m.Acquired(context.Background(), TryAcquire, time.Now(), Granted) // records on a no-op: no panic
	m.Renewed(Renewed, 0)
}
