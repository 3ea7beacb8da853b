package integration

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"cirello.io/pglock"
	_ "github.com/lib/pq" // pglock's ratified driver

	"github.com/fencelock/fencelock"
)

// BenchmarkPeerPglock: an uncontended grant and release by fencelock (TryAcquire + Release,
// one name) and by cirello.io/pglock v1.16.1 (AcquireContext + ReleaseContext, its defaults: a
// 20 s lease and a heartbeat goroutine every 5 s, through database/sql and lib/pq, the driver
// it checks for), alternating on one server with a SELECT 1 round trip as the floor. Reports
// each in microseconds, fencelock x floor, and pglock x fencelock (the peer's cost as a
// multiple of ours: the issue of fair hand-off asks for at least 2.5).
func BenchmarkPeerPglock(b *testing.B) {
	e := benchSetup(b)
	sqldb, err := sql.Open("postgres", e.url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sqldb.Close() })
	peer, err := pglock.New(sqldb)
	if err != nil {
		b.Fatal(err)
	}
	if err := peer.CreateTable(); err != nil {
		b.Fatal(err)
	}
	l, err := fencelock.NewLessor(e.pool)
	if err != nil {
		b.Fatal(err)
	}
	ours := func() error {
		lease, err := l.TryAcquire(e.ctx, "peer", time.Minute)
		if err != nil {
			return err
		}
		return lease.Release(e.ctx)
	}
	theirs := func() error {
		lk, err := peer.AcquireContext(e.ctx, "peer")
		if err != nil {
			return err
		}
		return peer.ReleaseContext(context.Background(), lk)
	}
	ops := []func() error{e.selectOne, ours, theirs}
	for range 200 { // warm-up
		for _, op := range ops {
			if err := op(); err != nil {
				b.Fatal(err)
			}
		}
	}
	var spent [3]time.Duration
	n := 0
	for b.Loop() {
		for i, op := range ops {
			t0 := time.Now()
			if err := op(); err != nil {
				b.Fatal(errors.Join(errors.New([]string{"floor", "fencelock", "pglock"}[i]), err))
			}
			spent[i] += time.Since(t0)
		}
		n++
	}
	us := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
	b.ReportMetric(us(spent[0]), "floor-us")
	b.ReportMetric(us(spent[1]), "fencelock-us")
	b.ReportMetric(us(spent[2]), "pglock-us")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "fencelock-x-floor")
	b.ReportMetric(float64(spent[2])/float64(spent[1]), "pglock-x-fencelock")
}
