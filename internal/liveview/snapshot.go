package liveview

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/internal/db"
)

// forceReleaseHolder is the holder fencelock.force_release writes into a lease row it fenced
// without handing it on: the row then carries the fence's token, not a grant.
const forceReleaseHolder = "fencelock force-release"

// Snapshot is one poll's answer: everything the pages show, read by one statement
// (LiveViewSnapshot). Times are the database's; Now is its clock when the statement ran.
type Snapshot struct {
	Now        time.Time   `json:"now"`
	Leases     []Lease     `json:"leases"`
	Waiters    []Waiter    `json:"waiters"`
	Advisory   []Advisory  `json:"advisory"`
	Semaphores []Semaphore `json:"semaphores"`
	Leaders    []Leader    `json:"leaders"`
	Jobs       []Job       `json:"jobs"`
	Fences     []Fence     `json:"fences"`
	RateLimits []RateLimit `json:"rate_limits"`

	// Cut names the lists that had more than the poll's row limit, each cut to the limit.
	Cut map[string]bool `json:"-"`
}

// Lease is a row of fencelock.leases: held when ExpiresAt is after the snapshot's Now, else a
// grant that ended since the previous poll (kept for the timeline).
type Lease struct {
	Name       string     `json:"name"`
	Holder     string     `json:"holder"`
	Token      int64      `json:"token"`
	AcquiredAt time.Time  `json:"acquired_at"`
	ExpiresAt  time.Time  `json:"expires_at"`
	Renewals   int64      `json:"renewals"`
	RenewedAt  *time.Time `json:"renewed_at"`
	// Handed: a release handed this grant to a waiter (fencelock.hand_off), which has not
	// claimed it yet; the grant before it was released, not expired.
	Handed bool `json:"handed"`
}

// lastStart is when the current TTL began: the last renewal of this grant, else its grant.
func (l Lease) lastStart() time.Time {
	if l.RenewedAt != nil {
		return *l.RenewedAt
	}
	return l.AcquiredAt
}

// TTL is the grant's current TTL: from its last renewal (or grant) to its expiry.
func (l Lease) TTL() time.Duration { return l.ExpiresAt.Sub(l.lastStart()) }

// Late reports whether the holder's heartbeat is late at now: its last renewal (or grant) is
// at least half a TTL old (what fencelock.holders calls "late").
func (l Lease) Late(now time.Time) bool { return now.Sub(l.lastStart()) >= l.TTL()/2 }

// Waiter is a live waiter of a lease's queue, in queue order within its name.
type Waiter struct {
	Name   string    `json:"name"`
	Holder string    `json:"holder"`
	Seq    int64     `json:"seq"`
	Since  time.Time `json:"since"`
	Notify bool      `json:"notify"`
}

// Advisory is a row of fencelock.advisory_locks: a backend holding or awaiting an advisory lock.
type Advisory struct {
	Key             *int64     `json:"key"`
	Key1            *int32     `json:"key1"`
	Key2            *int32     `json:"key2"`
	Name            *string    `json:"name"`
	Mode            string     `json:"mode"`
	Granted         bool       `json:"granted"`
	PID             int32      `json:"pid"`
	ApplicationName *string    `json:"application_name"`
	ClientAddr      *string    `json:"client_addr"`
	BackendStart    *time.Time `json:"backend_start"`
	XactStart       *time.Time `json:"xact_start"`
	State           *string    `json:"state"`
	WaitStart       *time.Time `json:"waitstart"`
	BlockedBy       []int32    `json:"blocked_by"`
}

// KeyText is the lock's key as the command shows it: "N", or "K1,K2" for a pair key.
func (a Advisory) KeyText() string {
	if a.Key != nil {
		return fmt.Sprint(*a.Key)
	}
	if a.Key1 != nil && a.Key2 != nil {
		return fmt.Sprintf("%d,%d", *a.Key1, *a.Key2)
	}
	return "?"
}

// Semaphore is a row of fencelock.semaphores with its permits held and its first waiters.
type Semaphore struct {
	Name    string   `json:"name"`
	Limit   int      `json:"permit_limit"`
	Permits []Permit `json:"permits"`
	Waiting int64    `json:"waiting"`
	Waiters []struct {
		Holder string    `json:"holder"`
		Seq    int64     `json:"seq"`
		Since  time.Time `json:"since"`
	} `json:"waiters"`
}

// Permit is a permit held: the lease of one of a semaphore's slots.
type Permit struct {
	Slot       string    `json:"slot"`
	Holder     string    `json:"holder"`
	Token      int64     `json:"token"`
	AcquiredAt time.Time `json:"acquired_at"`
	ExpiresAt  time.Time `json:"expires_at"`
}

// Leader is a row of fencelock.leaders: an election's leader, its term (the token) and value.
type Leader struct {
	Name      string    `json:"name"`
	Holder    string    `json:"holder"`
	Token     int64     `json:"token"`
	Value     *string   `json:"value"`
	ElectedAt time.Time `json:"elected_at"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Job is a row of fencelock.job_ledger, newest first.
type Job struct {
	Job        string     `json:"job"`
	Slot       time.Time  `json:"slot"`
	Holder     string     `json:"holder"`
	Token      int64      `json:"token"`
	Attempt    int        `json:"attempt"`
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	Outcome    string     `json:"outcome"`
	Error      *string    `json:"error"`
}

// Fence is a row of fencelock.fences: a resource's high-water mark.
type Fence struct {
	Resource string `json:"resource"`
	Token    int64  `json:"token"`
}

// RateLimit is a row of fencelock.rate_limits: a key's GCRA state. TAT (the theoretical
// arrival time) ahead of the clock is how much of the key's room is in use, in time: the key
// is idle again (its bucket full, in package ratelimit's words: ResetAfter) at TAT.
type RateLimit struct {
	Key       string    `json:"key"`
	TAT       time.Time `json:"tat"`
	Allowed   bool      `json:"allowed"`
	DecidedAt time.Time `json:"decided_at"`
}

// readSnapshot runs LiveViewSnapshot: the rows of lease grants still held or ended after
// since, every list cut at maxRows.
func readSnapshot(ctx context.Context, q db.DBTX, since time.Time, maxRows int) (*Snapshot, error) {
	text, err := db.New().LiveViewSnapshot(ctx, q, db.LiveViewSnapshotParams{Since: since, MaxRows: int32(maxRows)})
	if err != nil {
		return nil, err
	}
	s := new(Snapshot)
	if err := json.Unmarshal([]byte(text), s); err != nil {
		return nil, fmt.Errorf("decode the snapshot: %w", err)
	}
	s.Cut = map[string]bool{}
	cutList(s, "leases", &s.Leases, maxRows)
	cutList(s, "waiters", &s.Waiters, maxRows)
	cutList(s, "advisory", &s.Advisory, maxRows)
	cutList(s, "semaphores", &s.Semaphores, maxRows)
	cutList(s, "leaders", &s.Leaders, maxRows)
	cutList(s, "jobs", &s.Jobs, maxRows)
	cutList(s, "fences", &s.Fences, maxRows)
	cutList(s, "rate_limits", &s.RateLimits, maxRows)
	return s, nil
}

// cutList cuts *list to max rows, and records in s.Cut that it did.
func cutList[T any](s *Snapshot, name string, list *[]T, max int) {
	if len(*list) > max {
		*list = (*list)[:max]
		s.Cut[name] = true
	}
}
