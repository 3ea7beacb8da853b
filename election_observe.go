package fencelock

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fencelock/internal/db"
)

// electionChannel is the NOTIFY channel of every election; the payload is the election's name.
const electionChannel = "fencelock_election"

// observePoll is how often an observer behind a pooler (where LISTEN cannot be trusted) reads
// the leader, at most; never less often than a quarter of the term's TTL.
const observePoll = 250 * time.Millisecond

// Observe returns a channel that receives the election's state: the current one first, then
// each change: a new term, a value proclaimed, and the zero LeaderInfo when nobody leads (a
// term resigned or lapsed, and its successor, if any, not yet granted: a crashed leader's heir
// is granted just after the old term's expiry, which the observer reads first). It is closed
// when ctx ends, and not before; its goroutine and connection end with it.
//
// Changes wake the observer, not a poll: every Campaign, Proclaim and Resign NOTIFYs the
// election's observers, which LISTEN on a connection of their own (taken from the lessor's
// pool and not returned), and a term that lapses is noticed at its expiry, read from the
// database. It also reads at least once per TTL, for the ends that notify nobody (a term's
// lease released by other means than Resign, a renewal that committed just after the read at
// its expiry). Behind a pooler that shares sessions (where LISTEN cannot be trusted) the
// observer reads the leader every min(250 ms, TTL/4) instead; after a connection failure it
// reads again once reconnected (with a backoff while reads keep failing). Each read is bounded
// by max(TTL, 5 s). States reach the channel in the order they happened, terms rising; one that
// lasted less than a read is not delivered when the next replaced it before the read. A
// receiver that does not keep up holds the observer back; its LISTEN connection then reads no
// notification, and PostgreSQL's notification queue keeps them for it (a receiver stuck for
// very long under heavy NOTIFY traffic could fill that queue, which fails every NOTIFY).
//
// Safe for concurrent use; each call has its own channel and connection.
func (e *Election) Observe(ctx context.Context) <-chan LeaderInfo {
	ch := make(chan LeaderInfo)
	go e.observe(ctx, ch)
	return ch
}

// observer is the state of one Observe.
type observer struct {
	e    *Election
	ch   chan<- LeaderInfo
	last LeaderInfo
	sent bool
}

func (e *Election) observe(ctx context.Context, ch chan<- LeaderInfo) {
	defer close(ch)
	o := &observer{e: e, ch: ch}
	for n := 0; ctx.Err() == nil; n++ {
		read, err := o.session(ctx)
		if read {
			n = 0 // a new streak of failures: reconnect soon
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			e.lessor.cfg.common.logger.Warn("fencelock: election observer: connection lost; reconnecting", "election", e.name, "error", err)
		}
		t := time.NewTimer(listenBackoff(n))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// session observes on one connection until it fails or ctx ends: LISTEN where the connection
// reaches its own server session, else polling. read says whether a read of the leader
// succeeded on it (the reconnect's backoff starts over only then).
func (o *observer) session(ctx context.Context) (read bool, err error) {
	conn, pooled, err := openListening(ctx, o.e.lessor.pool, electionChannel)
	if err != nil {
		return false, err
	}
	defer closeListening(conn)
	poll := min(observePoll, o.e.ttl/4)
	for {
		// Read after LISTEN: a change committed from here on is both read or notified.
		wait, err := o.read(ctx, conn)
		if err != nil {
			return read, err
		}
		read = true
		wait = min(wait, o.e.ttl)
		if pooled {
			wait = min(wait, poll)
		}
		if err := o.await(ctx, conn, wait, pooled); err != nil {
			return read, err
		}
	}
}

// read reads the leader on conn, delivers it if it changed, and returns how long until the
// current term lapses (a day when nobody leads; the caller caps every wait at the TTL).
func (o *observer) read(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
	rctx, cancel := context.WithTimeout(ctx, max(o.e.ttl, 5*time.Second))
	row, err := o.e.lessor.q.ElectionLeader(rctx, conn, o.e.name)
	cancel()
	var info LeaderInfo
	wait := 24 * time.Hour
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return 0, err
	default:
		info = leaderInfoOf(row)
		wait = row.ExpiresAt.Sub(row.ServerNow) + time.Millisecond
	}
	if o.sent && info.Token < o.last.Token && info.Token != 0 {
		return wait, nil // an older term than one delivered: cannot be current for long
	}
	if !o.sent || info.Holder != o.last.Holder || info.Token != o.last.Token || info.Value != o.last.Value {
		select {
		case o.ch <- info:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		o.last, o.sent = info, true
	}
	return wait, nil
}

// await waits up to d for a notification of this election on conn (or, pooled, just d).
func (o *observer) await(ctx context.Context, conn *pgx.Conn, d time.Duration, pooled bool) error {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	if pooled {
		<-wctx.Done()
		return ctx.Err()
	}
	for {
		n, err := conn.WaitForNotification(wctx)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case wctx.Err() != nil:
			return nil // the term's expiry: read again
		case err != nil:
			return err
		case n.Payload == o.e.name:
			return nil
		}
	}
}

// leaderInfoOf converts a leader row.
func leaderInfoOf(row db.ElectionLeaderRow) LeaderInfo {
	return LeaderInfo{Holder: row.Holder, Token: Token(row.Token), Value: row.Value, ElectedAt: row.AcquiredAt, ExpiresAt: row.ExpiresAt}
}
