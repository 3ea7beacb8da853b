package job

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fencelock/fencelock/internal/db"
	"github.com/fencelock/fencelock/internal/pgerr"
	"github.com/fencelock/fencelock/internal/validate"
)

// Every runs fn once per slot of period every (a time.Duration of at least a millisecond, a
// whole number of microseconds) until ctx ends: slots are counted on the database clock from
// the Unix epoch (so they are aligned to UTC: a 24-hour period starts at midnight UTC), and
// every replica names the same slots whatever its own clock says; at each slot's start each
// replica calls [Job.RunSlot], and the ledger lets one of them run it.
//
// With [WithRetryCrashed] (or [WithRetryFailed]), Every runs again a crashed (failed) slot
// within the horizon below: one whose run crashed within about a TTL plus a period of the
// slot's start, including by a replica that starts after the crash. Older ones stay as they are.
//
// A slot that could not be claimed when it came (the job's lease held by a run of an earlier
// slot, or by a replica that died holding it; an error before the claim) is tried again, late,
// at the next wake (a quarter period later at most), while it is no older than the job's TTL
// plus one period, the horizon: a dead holder's lease keeps the job off for at most its TTL.
// A slot that passes its horizon unclaimed is given up and recorded as missed in the ledger,
// so every gap has its row. Late slots run in order, back to back, and a run longer than the
// period makes the next ones late, up to the horizon. A replica that starts runs from the slot
// after the ledger's latest one within the horizon (so a slot left unrun by replicas that died
// is run by the ones that replace them), else from the current slot: a first deployment runs
// no past slot. Slots may run out of order across replicas. After a failed read of the
// database clock it waits as the lessor's [fencelock.Lessor.Backoff] says.
//
// Errors of a slot (fn's, the database's) do not stop it; onErr, if not nil, is told of each
// ([ErrSlotBusy] and [ErrSlotDone] are not errors here). It returns ctx's error; an
// [*fencelock.ArgumentError] at once, before any SQL, for a bad period or a nil fn. Safe for
// concurrent use (with any number of Every and RunSlot calls of the job).
func (j *Job) Every(ctx context.Context, every time.Duration, fn Func, onErr func(slot time.Time, err error)) error {
	if every < time.Millisecond || every%time.Microsecond != 0 {
		return validate.Errorf("every", "is %v; it must be at least 1ms and a whole number of microseconds", every)
	}
	if fn == nil {
		return validate.Errorf("fn", "must not be nil")
	}
	reach := time.Duration(int64(j.ttl+every)/int64(every)) * every // the horizon's depth, on the grid
	var next time.Time                                              // the oldest slot this replica has not settled; zero: not read yet
	for n := 0; ; n++ {
		row, err := j.q.JobSlot(ctx, j.pool, every.Microseconds())
		readAt := time.Now()
		wait := time.Duration(row.UntilNextUs) * time.Microsecond
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			if onErr != nil {
				onErr(time.Time{}, pgerr.Wrap(fmt.Sprintf("job %q: read the slot", j.name), err))
			}
			wait = j.lessor.Backoff()(n)
		default:
			n = -1
			current := row.Slot
			if next.IsZero() {
				next = j.startSlot(ctx, current, every, reach)
			}
			for ; !next.After(current); next = next.Add(every) {
				// The horizon moves on while earlier slots run: the database clock now.
				if horizon := current.Add(time.Since(readAt) - reach); next.Before(horizon) {
					j.giveUp(ctx, next, onErr)
					if ctx.Err() != nil {
						return ctx.Err()
					}
					continue
				}
				err := j.RunSlot(ctx, next, fn)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				var unclaimed *errUnclaimed
				if errors.As(err, &unclaimed) {
					if !errors.Is(err, ErrSlotBusy) && onErr != nil {
						onErr(next, err)
					}
					break // not claimed: this slot again at the next wake
				}
				if err != nil && !errors.Is(err, ErrSlotDone) && onErr != nil {
					onErr(next, err)
				}
			}
			if !next.After(current) {
				wait = min(wait, max(every/4, time.Millisecond)) // an unclaimed slot: look again soon
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// startSlot is where a replica that starts picks up: the oldest slot within the horizon that its
// retry policy runs again, else the first slot of the grid after the ledger's latest one within
// the horizon (a row off the grid, from a RunSlot of another instant or another period, is
// rounded up onto it), else current (a first deployment runs no past slot).
func (j *Job) startSlot(ctx context.Context, current time.Time, every, reach time.Duration) time.Time {
	since := current.Add(-reach)
	row, err := j.q.JobLastSlot(ctx, j.pool, db.JobLastSlotParams{
		Job: j.name, Since: since, Until: current, RetryCrashed: j.cfg.retryCrashed, RetryFailed: j.cfg.retryFailed,
	})
	if err != nil || !row.Last.After(since.Add(-time.Microsecond)) {
		return current
	}
	// The first grid slot after last: current minus whole periods, not before last.
	next := current.Add(-current.Sub(row.Last) / every * every)
	if !next.After(row.Last) {
		next = next.Add(every)
	}
	if !row.OldestRetry.Before(since) && row.OldestRetry.Before(next) {
		// The grid slot at or before it (a slot off the grid is not Every's to run again).
		retry := current.Add(-((current.Sub(row.OldestRetry) + every - 1) / every * every))
		if retry.Before(since) {
			retry = since
		}
		next = retry
	}
	return next
}

// giveUp records slot as missed, past its horizon unclaimed.
func (j *Job) giveUp(ctx context.Context, slot time.Time, onErr func(time.Time, error)) {
	if err := j.q.JobGiveUp(ctx, j.pool, db.JobGiveUpParams{Job: j.name, Slot: slot, Holder: j.holder}); err != nil && onErr != nil {
		onErr(slot, pgerr.Wrap(fmt.Sprintf("job %q: record slot %v as missed", j.name, slot), err))
	}
}
