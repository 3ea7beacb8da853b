package integration

import (
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/fencelock/fencelock"
)

// BenchmarkMetricsOverhead: an uncontended TryAcquire and Release on a lessor whose metrics go
// to a real OpenTelemetry SDK provider (a manual reader, collected every 1,000 iterations as an
// exporter would), beside the same on a lessor with the no-op provider; x-floor is the cost
// ratio of the metrics (target: within 1.02x).
func BenchmarkMetricsOverhead(b *testing.B) {
	e := benchSetup(b)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(e.ctx) }()
	withSDK, err := fencelock.NewLessor(e.pool, fencelock.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	without, err := fencelock.NewLessor(e.pool, fencelock.WithMeterProvider(noop.NewMeterProvider()))
	if err != nil {
		b.Fatal(err)
	}
	cycle := func(l *fencelock.Lessor, name string) func() error {
		return func() error {
			lease, err := l.TryAcquire(e.ctx, name, time.Minute)
			if err != nil {
				return err
			}
			return lease.Release(e.ctx)
		}
	}
	n := 0
	sdk := cycle(withSDK, "with-sdk")
	ratio(b, func() error {
		if n++; n%1000 == 0 {
			var rm metricdata.ResourceMetrics
			if err := reader.Collect(e.ctx, &rm); err != nil {
				return err
			}
		}
		return sdk()
	}, cycle(without, "no-op"))
}
