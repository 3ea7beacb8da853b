package timing_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock/internal/timing"
)

// Exponential doubles from min, caps at max, and jitters each wait within [d/2, d]; an
// attempt past the int64 range of a shift stays at max.
func TestExponential(t *testing.T) {
	b := timing.Exponential(10*time.Millisecond, time.Second)
	for _, tc := range []struct {
		attempt int
		d       time.Duration
	}{
		{0, 10 * time.Millisecond},
		{1, 20 * time.Millisecond},
		{6, 640 * time.Millisecond},
		{7, time.Second},
		{62, time.Second},
		{1000, time.Second},
	} {
		for range 100 {
			got := b(tc.attempt)
			require.GreaterOrEqual(t, got, tc.d/2, "attempt %d", tc.attempt)
			require.LessOrEqual(t, got, tc.d, "attempt %d", tc.attempt)
		}
	}
}
