package timing

import "time"

// The schedule of a lease: when it is renewed, when a failed renewal is retried, when it is
// left to lapse, when its holder stops trusting it, and how long an acquire waits before its
// next attempt. Pure functions of their arguments (the current time is one of them), so the
// schedule is table-tested without a server and without the wall clock (schedule_test.go);
// the heartbeat and the trust watch (internal/renewal) and the waits in a lease's queue apply
// them.

const (
	// lapseSlack: a lease whose trust window ends sooner than this (or an eighth of its
	// heartbeat) is not renewed; its window ends before a renewal could come back.
	lapseSlack = 5 * time.Millisecond
	// retryFloor: a failed renewal is retried at least a quarter heartbeat plus this later.
	retryFloor = 5 * time.Millisecond
)

// Times are the durations of one lease, resolved from its TTL and the lessor's options by the
// lessor's configuration: TTL > Margin >= 0, and Heartbeat in (0, TTL - Margin), or 0 for a
// lease without a heartbeat. A value; safe to share.
type Times struct {
	TTL, Heartbeat, Margin time.Duration
}

// TrustEnd returns the end of the trust window of a grant or renewal sent at sent:
// sent + TTL - Margin.
func (t Times) TrustEnd(sent time.Time) time.Time { return sent.Add(t.TTL - t.Margin) }

// NextRenewal returns when a lease granted or renewed at sent is next due: one heartbeat
// later, or the zero time without a heartbeat.
func (t Times) NextRenewal(sent time.Time) time.Time {
	if t.Heartbeat <= 0 {
		return time.Time{}
	}
	return sent.Add(t.Heartbeat)
}

// QueueAt returns when the heartbeat takes a lease due at nextRenew: a quarter heartbeat
// early, so that the renewal's round trip and a retry or two fit before the lease is due.
func (t Times) QueueAt(nextRenew time.Time) time.Time {
	return nextRenew.Add(-t.Heartbeat / 4)
}

// RetryAt returns when a renewal that failed at now is tried again: half a heartbeat later,
// at least a quarter heartbeat plus 5 ms (leases are queued a quarter heartbeat early, see
// QueueAt). The zero time without a heartbeat.
func (t Times) RetryAt(now time.Time) time.Time {
	if t.Heartbeat <= 0 {
		return time.Time{}
	}
	return now.Add(max(t.Heartbeat/2, t.Heartbeat/4+retryFloor))
}

// Verdict is what the heartbeat does with a lease it takes from its queue.
type Verdict int

// The verdicts.
const (
	RenewNow   Verdict = iota // due: renew it in this round
	RenewLater                // renewed since it was queued: queue it at its new time
	RenewLapse                // its trust window ends too soon for a renewal to help: let it lapse
)

// Verdict decides, at now, for a lease next due at nextRenew whose trust window ends at
// trustUntil. A lease whose window ends within max(5 ms, Heartbeat/8) is left to the trust
// watch, which ends it when the window ends: a renewal could not come back in time.
func (t Times) Verdict(now, nextRenew, trustUntil time.Time) Verdict {
	switch {
	case trustUntil.Sub(now) <= max(lapseSlack, t.Heartbeat/8):
		return RenewLapse
	case t.QueueAt(nextRenew).After(now):
		return RenewLater
	}
	return RenewNow
}

const (
	// minQueueLiveness and maxQueueLiveness bound how long a waiter stays in a lease's queue
	// after its last refresh (QueueLiveness).
	minQueueLiveness = 250 * time.Millisecond
	maxQueueLiveness = 5 * time.Second
)

// RunLockedLiveness is the liveness of a RunLocked's place in a queue (it has no TTL): a
// refresh every third of a second.
const RunLockedLiveness = time.Second

// QueueLiveness returns how long a waiter for a lease of TTL ttl stays in the name's queue
// after its last refresh: the TTL, within [250 ms, 5 s]. A waiter that dies or is paused
// leaves the queue that long after its last refresh, so it blocks the waiters behind it for at
// most that long; a live one refreshes every third of it (QueueWait).
func QueueLiveness(ttl time.Duration) time.Duration {
	return min(max(ttl, minQueueLiveness), maxQueueLiveness)
}

// QueueWait returns how long a waiting Acquire sleeps after a refused attempt before its next
// one, unless a release wakes it first. listening: the attempt carried the lessor's NOTIFY
// channel, so a release hands the lease over and wakes it; it then only refreshes its place
// every third of the liveness live, and, at the head of the queue (ahead == 0), tries again
// just after the holder's grant expires (a holder that died hands nothing over). Not listening
// (a transaction pooler, a listening connection lost or not up yet): backoff, or the holder's
// remaining TTL plus jitter when that is shorter. remaining is the holder's remaining TTL
// reported by the attempt (0: free or unknown).
func QueueWait(listening bool, ahead int64, remaining, live, backoff, jitter time.Duration) time.Duration {
	if !listening {
		if remaining > 0 && remaining < backoff {
			return remaining + jitter
		}
		return backoff
	}
	refresh := live / 3
	switch {
	case ahead > 0:
		return refresh
	case remaining <= 0:
		return min(backoff, refresh) // free, yet refused: a row locked for a moment (a guarded transaction, a RunLocked)
	case remaining < refresh:
		return remaining + jitter
	}
	return refresh
}

// HandedGrantSent returns the send time, on the local clock, that a grant handed over by a
// release counts as (its trust window is TrustEnd of it): the local image of the grant's start,
// its expiry on the database clock less its TTL, mapped through a statement of the waiter
// that was sent at sent (local clock) while the database clock read serverNow. serverNow
// happened after sent, so the database clock runs at most serverNow - sent ahead of the local
// one, and the expiry happens on the local clock no earlier than sent + (expiresAt -
// serverNow): the window then ends that minus the safety margin, with the clock-rate
// assumption of every trust window, over the statement's age as well. Never later than now:
// a window never starts in the future. ok is false without a statement to map through.
func HandedGrantSent(sent, serverNow, expiresAt time.Time, ttl time.Duration, now time.Time) (t time.Time, ok bool) {
	if sent.IsZero() || serverNow.IsZero() {
		return time.Time{}, false
	}
	t = sent.Add(expiresAt.Sub(serverNow) - ttl)
	if t.After(now) {
		t = now
	}
	return t, true
}
