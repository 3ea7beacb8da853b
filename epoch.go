package fencelock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fencelock/internal/db"
)

// RebaseTokenEpoch makes the tokens issued from now on, by the database behind pool, larger
// than every token it, or the database it was copied from, has issued, and returns once every
// standby streaming from the primary has replayed the change and every standby the primary
// keeps a physical replication slot for has received it. A standby's promotion and a
// point-in-time recovery need nothing: they start a new, higher timeline. pg_upgrade (it
// starts the new cluster on timeline 1) and a logical copy (pg_dump and restore, logical
// replication) onto another cluster take the timeline back: grants then fail with
// [ErrTokenEpochBehind] until RebaseTokenEpoch is called on it. The database remembers the
// highest epoch it issued tokens in, whatever transaction drew the epoch's first token and
// however it ended (fencelock.token_epoch.last_epoch, and fencelock.token_epoch_marks for
// tokens drawn while another transaction held that row); a logical copy that left out either
// table cannot know: call RebaseTokenEpoch after any copy, before any grant there.
//
// It raises fencelock.token_epoch.epoch_offset, which is added to the timeline, so that the
// next epoch is at least atLeast and above both the highest epoch recorded (last_epoch and
// every mark) and the epoch of every token in fencelock.leases, fencelock.fences and
// fencelock.token_flushes; it never lowers it. Pass as atLeast the source's epoch plus one (a
// token it issued last, t.Epoch()+1) when its tokens are kept outside those tables too
// ([UpdateFencedTx] columns, external systems), else 0. It returns the epoch of the next
// token, 1 to 65535. It scans those three tables: run it once, not per grant. A second call is
// safe: it raises the epoch again only above tokens issued since, and waits for the standbys
// again.
//
// # The wait for the standbys
//
// The offset is an ordinary row: a promotion of a standby that has not replayed the rebase's
// commit loses the raised epoch, and the promoted server then issues tokens below those the
// old primary issued after the rebase. So, once its transaction has committed, it reads the
// primary's WAL flush position (at or past the end of the commit record: the commit is
// flushed, synchronous_commit off or not), the standbys that pg_stat_replication lists at
// that moment and the physical replication slots that pg_replication_slots lists with a
// restart_lsn, and returns once each standby has reported a replay_lsn at or past that
// position and each slot's restart_lsn is at or past it, whether a standby streams through
// the slot or not.
//
// A slot's restart_lsn is the position the primary sees for the standby that streams through
// it: where that standby resumes streaming, which the primary moves to the flush position
// (flush_lsn) of each status message the standby sends. A standby that has flushed the commit
// to its pg_wal has it, though crashed before replaying it: it replays its pg_wal when it
// starts again, and when promoted it first replays the WAL in its pg_wal ("Before failover,
// any WAL immediately available in the archive or in pg_wal will be restored", PostgreSQL's
// "Log-Shipping Standby Servers").
// One whose slot is behind the commit lacks it, connected or not; one that connects again
// streams from restart_lsn and moves it on. Not waited for: a logical slot; a slot without a
// restart_lsn (created without reserving WAL and never used, or invalidated by
// max_slot_wal_keep_size: no standby resumes from it); a slot dropped during the wait; a slot
// whose WAL sender turns out to report no replay position (pg_receivewal, pg_basebackup's WAL
// stream); and a slot left out with [ExceptSlot] ([RebaseTokenEpochOpts]). A slot whose
// standby is gone for good keeps the call waiting until ctx ends: drop the slot or leave it
// out.
//
// There is no event for a standby's replay: it polls pg_stat_replication and
// pg_replication_slots (one statement), every 2 ms at first, backing off to every 50 ms. A
// standby reports its replay position when it receives WAL and at its status interval
// (wal_receiver_status_interval, 10 s by default), so:
//   - the rebase commits with synchronous_commit = remote_apply where
//     synchronous_standby_names is empty (the commit then waits for the local flush alone, as
//     with on), which asks every standby to report as soon as it has replayed the commit;
//     where synchronous standbys are named, it keeps the session's setting (raised from off to
//     on), whose commit waits for them as every commit there does;
//   - while a standby has not reported the replay, or a slot has not passed the commit, it
//     commits an empty transaction (it takes one transaction id; synchronous_commit = local)
//     after 100 ms, then at doubling intervals up to 5 s: its WAL makes every connected
//     standby report again, its flush position with its replay position.
//
// It waits for the physical standbys streaming from this server and for its physical slots:
// not for a cascading standby (fed by another standby, which is waited for), nor for one
// disconnected at that moment without a slot, nor for logical replication, pg_receivewal or
// a base backup. A standby whose connection drops during the wait is still waited for; a new
// connection with its application_name and client_addr counts for it once that has replayed
// the rebase. A standby with recovery_min_apply_delay keeps the call waiting that long. ctx
// bounds the whole call, the wait included; there is no other bound. On a server without
// standbys or slots it returns 10 ms after its commit: a lease grant draws its token from the epoch in its statement's snapshot
// when the statement has run for less than 5 ms, and the call returns only once every grant
// that started before the commit has passed that point (issue 31), so a token drawn after
// the call returns is of the new epoch. The rebase's transaction is four round trips (BEGIN,
// the setting, the rebase, COMMIT), and the wait for standbys one statement more.
//
// The role needs UPDATE on fencelock.token_epoch and SELECT on fencelock.token_epoch_marks
// and, where there are standbys, the privileges of pg_read_all_stats (pg_monitor includes
// it; a superuser has them): without them pg_stat_replication lists the WAL senders but not
// their progress, and the grants of README.md's "Least privilege" do not give them. A role
// that sees WAL senders listed but not their progress does not wait for what it cannot see:
// it returns at once a [*RebaseReplayError] with [ErrReplayNotVisible], the rebase committed.
// pg_replication_slots shows every role the slots' positions: a role waits for the slots of
// disconnected standbys without those privileges. Safe for concurrent use: concurrent calls
// serialise on the offset's row, and a call waits for a transaction that holds that row (a
// RunLocked that drew a new epoch's first token, or folded marks) to end; each call then
// waits for the replay of its own commit.
//
// Errors: an [*ArgumentError] for a nil pool or atLeast > 65535 (before any SQL); an error
// wrapping [ErrTokenBudget] if the epoch would pass 65535; an error wrapping [ErrReadOnly] on a
// hot standby; otherwise the pgx error, wrapped (when ctx ends or the connection breaks before
// the commit's reply, whether the rebase committed is unknown: call it again). After the
// commit, a [*RebaseReplayError] (matching [ErrRebaseNotReplayed]) when ctx ended before every
// standby replayed the rebase and every slot passed it (it wraps ctx's error and names those
// standbys and slots), when the role cannot see their progress ([ErrReplayNotVisible]), or
// when reading pg_stat_replication failed (it wraps that error); the rebase is committed on
// the primary, and RebaseTokenEpoch then returns its epoch together with the error. Call
// RebaseTokenEpoch again to wait again; if a standby it names, or the standby of a slot it
// names, is promoted before it has the rebase, call RebaseTokenEpoch on the promoted server
// with atLeast = [RebaseReplayError.Epoch] + 1 before any grant there.
func RebaseTokenEpoch(ctx context.Context, pool *pgxpool.Pool, atLeast uint32) (uint32, error) {
	return RebaseTokenEpochOpts(ctx, pool, atLeast)
}

// RebaseTokenEpochOpts is [RebaseTokenEpoch] with options: [ExceptSlot] leaves a physical
// replication slot out of the wait. It returns what RebaseTokenEpoch returns, and an
// [*ArgumentError] for a nil option or a bad slot name, before any SQL. Safe for concurrent use.
func RebaseTokenEpochOpts(ctx context.Context, pool *pgxpool.Pool, atLeast uint32, opts ...RebaseOption) (uint32, error) {
	if pool == nil {
		return 0, argError("pool", "must not be nil")
	}
	if atLeast > 1<<TokenEpochBits-1 {
		return 0, argError("atLeast", "%d is past the last epoch, %d", atLeast, 1<<TokenEpochBits-1)
	}
	cfg := rebaseConfig{exceptSlots: []string{}}
	if err := applyAll(opts, func(o RebaseOption) error { return o.applyRebase(&cfg) }); err != nil {
		return 0, err
	}
	var epoch int32
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, rebaseCommitModeSQL); err != nil {
			return err
		}
		var err error
		epoch, err = db.New().TokenEpochRebase(ctx, tx, int32(atLeast))
		return err
	})
	if err != nil {
		return 0, wrapPg("rebase token epoch", err)
	}
	committed := time.Now()
	err = awaitStandbyReplay(ctx, pool, uint32(epoch), cfg.exceptSlots)
	if serr := awaitInflightDraws(ctx, uint32(epoch), committed); err == nil {
		err = serr // after a replay error too, the draws in flight are waited for (unless ctx ended)
	}
	return uint32(epoch), err
}

// RebaseOption configures one call of [RebaseTokenEpochOpts]: [ExceptSlot]. The call validates
// its options before any SQL runs (a nil option is an [*ArgumentError]). An option of a
// constructor does not compile here. Like them, a RebaseOption is an immutable value, safe to
// share between calls and goroutines.
type RebaseOption interface {
	applyRebase(*rebaseConfig) error
}

// rebaseConfig is what one rebase call's options ask for.
type rebaseConfig struct {
	exceptSlots []string // slot names the wait leaves out; never nil (the statement's $2)
}

// rebaseOption is a [RebaseOption].
type rebaseOption func(*rebaseConfig) error

func (o rebaseOption) applyRebase(c *rebaseConfig) error { return o(c) }

// maxSlotName is the longest replication slot name PostgreSQL accepts: NAMEDATALEN - 1 bytes.
const maxSlotName = 63

// ExceptSlot leaves the physical replication slot name out of the slots [RebaseTokenEpochOpts]
// waits for. It is for a slot whose standby is gone and will not be promoted (decommissioned,
// or to be rebuilt from a new base backup): the rebase never reaches such a slot, which would
// keep the call waiting until its ctx ends. Dropping the slot (pg_drop_replication_slot) ends
// the wait for it too, and stops it holding WAL on the primary. Such a standby, if promoted
// after all, lacks the rebase: call RebaseTokenEpoch on it with atLeast = the rebased epoch +
// 1 before any grant there. Only the slot is left out: a standby streaming through it is still
// waited for, as one streaming without a slot is. A name that no slot has changes nothing (a
// misspelled one leaves the slot meant waited for, and the error names it). Give it once per
// slot.
//
// name must be a valid slot name, as PostgreSQL requires: 1 to 63 characters, each a lower
// case letter, a digit or an underscore; otherwise the call returns an [*ArgumentError].
//
// Default: every physical slot with a restart_lsn is waited for.
func ExceptSlot(name string) RebaseOption {
	return rebaseOption(func(c *rebaseConfig) error {
		if name == "" || len(name) > maxSlotName {
			return argError("ExceptSlot", "slot name %q must be 1 to %d characters", name, maxSlotName)
		}
		for _, r := range name {
			if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
				return argError("ExceptSlot", "slot name %q has %q: a slot name has only lower case letters, digits and underscores", name, r)
			}
		}
		c.exceptSlots = append(c.exceptSlots, name)
		return nil
	})
}

// rebaseSettle is how long RebaseTokenEpoch waits after its commit before it returns: twice
// the 5 ms for which a lease grant statement draws its token inline from the epoch in its own
// snapshot (LeaseGrant in sqlc/queries/leases.sql), so that a grant whose snapshot predates
// the commit, and that draws after it, has drawn before the call returns: every draw that
// starts after the call returns is of the new epoch.
const rebaseSettle = 10 * time.Millisecond

// awaitInflightDraws waits until rebaseSettle has passed since committed, or ctx ends (a
// [*RebaseReplayError] of epoch with ctx's error and no standby: the rebase is committed).
func awaitInflightDraws(ctx context.Context, epoch uint32, committed time.Time) error {
	d := rebaseSettle - time.Since(committed)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return &RebaseReplayError{Epoch: epoch, Cause: context.Cause(ctx)}
	}
}

var (
	// ErrRebaseNotReplayed matches every [*RebaseReplayError]: [RebaseTokenEpoch] committed
	// its rebase on the primary but returned before it saw every standby replay it.
	ErrRebaseNotReplayed = errors.New("fencelock: token epoch rebase committed on the primary, not confirmed replayed by every standby")

	// ErrReplayNotVisible is the cause inside a [*RebaseReplayError] when the role cannot see
	// its standbys' replay progress: pg_stat_replication shows it only to superusers and
	// members of pg_read_all_stats (or pg_monitor, which includes it).
	ErrReplayNotVisible = errors.New("fencelock: the role cannot see the standbys' replay progress (pg_stat_replication needs pg_read_all_stats or pg_monitor)")
)

// RebaseReplayError reports that [RebaseTokenEpoch] committed its rebase on the primary (the
// primary's next token has epoch Epoch) but returned before every standby streaming from the
// primary had replayed it, and every physical replication slot of the primary had passed it:
// Standbys lists the standbys that had not replayed it (none when pg_stat_replication could
// not be read), Slots the slots whose restart_lsn was behind it, and Cause says why the call
// stopped waiting: ctx's error, or [ErrReplayNotVisible], or the error of reading
// pg_stat_replication. It matches [ErrRebaseNotReplayed] under [errors.Is] and unwraps to
// Cause.
//
// A promotion of one of Standbys before it replays WAL position LSN, or of the standby of one
// of Slots before it streams again past LSN, loses the rebase: the promoted server issues
// tokens of a lower epoch. Call RebaseTokenEpoch again to wait for the replay (safe: it raises
// the epoch again only above tokens issued since), or, on a server promoted without it, call
// RebaseTokenEpoch(ctx, pool, Epoch+1) there before any grant. A slot whose standby is gone
// for good: drop it, or leave it out with [ExceptSlot].
type RebaseReplayError struct {
	Epoch    uint32           // the epoch of the primary's next token: the rebase is committed
	LSN      string           // the primary's WAL flush position right after the commit, as pg_lsn text
	Standbys []PendingStandby // the standbys that had not replayed LSN
	Slots    []PendingSlot    // the physical replication slots whose restart_lsn was before LSN
	Cause    error
}

// PendingStandby is a standby, as pg_stat_replication shows it, that had not replayed a
// rebase when [RebaseTokenEpoch] returned (see [RebaseReplayError]).
type PendingStandby struct {
	ApplicationName string // application_name: the standby's cluster_name, or the one in its primary_conninfo
	ClientAddr      string // client_addr; "" for a Unix socket or when the role cannot see it
	ReplayLSN       string // the last replay_lsn it reported, as pg_lsn text; "" if none or not visible
	Disconnected    bool   // its WAL sender had gone when the call returned
}

// String describes the standby: its application_name, address and replay position.
func (s PendingStandby) String() string {
	addr := s.ClientAddr
	if addr == "" {
		addr = "address not shown"
	}
	var state string
	switch {
	case s.Disconnected:
		state = "disconnected"
	case s.ReplayLSN == "":
		state = "no replay position seen"
	default:
		state = "replayed up to " + s.ReplayLSN
	}
	return fmt.Sprintf("%q (%s, %s)", s.ApplicationName, addr, state)
}

// PendingSlot is a physical replication slot of the primary, as pg_replication_slots shows it,
// whose restart_lsn had not reached a rebase's commit when [RebaseTokenEpoch] returned (see
// [RebaseReplayError]): the standby that streams through it, connected or not, had not told
// the primary that it had flushed the commit.
type PendingSlot struct {
	Name       string // slot_name
	RestartLSN string // restart_lsn, as pg_lsn text: where its standby resumes, the WAL it last reported flushed
	Active     bool   // active: a WAL sender streamed from it when the call returned
}

// String describes the slot: its name, whether a standby streams through it, and its
// restart_lsn.
func (s PendingSlot) String() string {
	state := "inactive"
	if s.Active {
		state = "active"
	}
	return fmt.Sprintf("%q (%s, restart_lsn %s)", s.Name, state, s.RestartLSN)
}

// Error describes the RebaseReplayError: the committed epoch, the standbys and slots, the cause
// and what to do.
func (e *RebaseReplayError) Error() string {
	list := func(one, many string, n int, name func(int) string) string {
		names := make([]string, n)
		for i := range names {
			names[i] = name(i)
		}
		noun := one
		if n > 1 {
			noun = many
		}
		return noun + " " + strings.Join(names, ", ")
	}
	standbys := list("standby", "standbys", len(e.Standbys), func(i int) string { return e.Standbys[i].String() })
	slots := list("replication slot", "replication slots", len(e.Slots), func(i int) string { return e.Slots[i].String() })
	var what string
	switch {
	case errors.Is(e.Cause, ErrReplayNotVisible):
		what = fmt.Sprintf("the role cannot see whether its standbys replayed it: %s", standbys)
		if len(e.Slots) > 0 {
			what += fmt.Sprintf("; not yet flushed (WAL position %s) through %s", e.LSN, slots)
		}
	case len(e.Standbys) == 0 && len(e.Slots) == 0:
		what = "its standbys' replay could not be followed"
	case len(e.Slots) == 0:
		what = fmt.Sprintf("not replayed (WAL position %s) by %s", e.LSN, standbys)
	case len(e.Standbys) == 0:
		what = fmt.Sprintf("not flushed (WAL position %s) by the standby of %s", e.LSN, slots)
	default:
		what = fmt.Sprintf("not replayed (WAL position %s) by %s, nor flushed through %s", e.LSN, standbys, slots)
	}
	var slotAdvice string
	if len(e.Slots) > 0 {
		slotAdvice = "; drop a slot whose standby is gone for good, or leave it out with ExceptSlot"
	}
	return fmt.Sprintf("fencelock: token epoch rebased to %d and committed on the primary, but %s: %v; "+
		"a promotion of a standby that lacks it loses the rebase: call RebaseTokenEpoch again to wait for the replay, "+
		"or on a server promoted without it call RebaseTokenEpoch with atLeast %d before any grant%s",
		e.Epoch, what, e.Cause, e.Epoch+1, slotAdvice)
}

// Is reports whether target is [ErrRebaseNotReplayed].
func (e *RebaseReplayError) Is(target error) bool { return target == ErrRebaseNotReplayed }

// Unwrap returns Cause.
func (e *RebaseReplayError) Unwrap() error { return e.Cause }

// The wait for the standbys' replay: plain SQL, not sqlc's, since sqlc's catalog has no
// pg_stat_replication (as backend.go's reads of pg_stat_activity).
const (
	// rebaseCommitModeSQL runs in the rebase's transaction, before it. remote_apply sets a
	// flag in the commit record that makes each standby's WAL receiver report its replay
	// position as soon as it has replayed the commit; with synchronous_standby_names empty the
	// commit itself waits for nothing but the local flush, as with on. Where synchronous
	// standbys are named, remote_apply would make the commit wait for them to replay, which a
	// synchronous pg_receivewal (Barman) never reports: keep the session's setting there,
	// raised from off to on so that the commit is flushed before the flush position is read.
	rebaseCommitModeSQL = `SELECT pg_catalog.set_config('synchronous_commit',
		CASE WHEN pg_catalog.current_setting('synchronous_standby_names') = '' THEN 'remote_apply'
			WHEN pg_catalog.current_setting('synchronous_commit') = 'off' THEN 'on'
			ELSE pg_catalog.current_setting('synchronous_commit') END, true)`

	// replayStateSQL lists the WAL senders of the server that feed physical standbys, and its
	// physical replication slots that have a position (restart_lsn) and are not in $2 (text[]),
	// with the target, $1 or (when $1 is NULL: right after the commit) the WAL flush position,
	// which is at or past the end of the commit record since the commit was flushed. A slot
	// and the WAL sender streaming from it (its active_pid) share a row; a sender without a
	// slot has NULL slot columns, a slot without a sender a NULL pid. One row with a NULL pid
	// and slot when there are none. A logical WAL sender streams from an active logical slot.
	// A role without pg_read_all_stats sees other roles' senders listed, but every column
	// except pid and application_name NULL (state is NULL only then); pg_replication_slots
	// shows every role everything. A slot's restart_lsn is NULL once it has never reserved WAL
	// or was invalidated (max_slot_wal_keep_size): no standby resumes from it.
	replayStateSQL = `WITH target AS (SELECT coalesce($1::text::pg_lsn, pg_catalog.pg_current_wal_flush_lsn()) AS lsn),
		senders AS (SELECT r.* FROM pg_catalog.pg_stat_replication AS r
			WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_replication_slots AS s
				WHERE s.active_pid = r.pid AND s.slot_type = 'logical')),
		slots AS (SELECT s.slot_name::text AS name, s.active, s.active_pid, s.restart_lsn
			FROM pg_catalog.pg_replication_slots AS s
			WHERE s.slot_type = 'physical' AND s.restart_lsn IS NOT NULL
				AND s.slot_name::text <> ALL (coalesce($2::text[], '{}'::text[])))
		SELECT t.lsn::text, r.pid, coalesce(r.application_name, ''), coalesce(pg_catalog.host(r.client_addr), ''),
			r.state IS NOT NULL, coalesce(r.state, ''), r.reply_time IS NOT NULL,
			coalesce(r.replay_lsn::text, ''), coalesce(r.replay_lsn >= t.lsn, false),
			s.name, coalesce(s.active, false), coalesce(s.restart_lsn::text, ''), coalesce(s.restart_lsn >= t.lsn, false)
		FROM target AS t LEFT JOIN (senders AS r FULL JOIN slots AS s ON s.active_pid = r.pid) ON true`

	// replayNudgeSQL commits a transaction that writes nothing but its commit record (it takes
	// a transaction id), flushed locally without waiting for any standby. The new WAL makes
	// each standby's WAL receiver send a status message, which carries its replay position.
	replayNudgeSQL = `SELECT pg_catalog.set_config('synchronous_commit', 'local', true), pg_catalog.pg_current_xact_id()`
)

// The polling of pg_stat_replication (see RebaseTokenEpoch).
const (
	replayPollFirst  = 2 * time.Millisecond
	replayPollMax    = 50 * time.Millisecond
	replayNudgeFirst = 100 * time.Millisecond
	replayNudgeMax   = 5 * time.Second
	// replaySnapshotTimeout bounds the one read of the standbys made after ctx has ended, so
	// that the error can still name them.
	replaySnapshotTimeout = 5 * time.Second
)

// replayRow is a WAL sender's part of a row of replayStateSQL.
type replayRow struct {
	pid      int32
	standby  PendingStandby
	visible  bool // the role may see its progress
	state    string
	replied  bool // it has sent a status message
	replayed bool // replay_lsn >= the target
}

// isStandby reports whether the WAL sender feeds something that replays WAL: not a base
// backup's sender, nor a receiver that reports no replay position (pg_receivewal,
// pg_basebackup's WAL stream) once it has sent a status message.
func (r replayRow) isStandby() bool {
	return !r.visible || (r.state != "backup" && (!r.replied || r.standby.ReplayLSN != ""))
}

// slotRow is a physical replication slot's part of a row of replayStateSQL.
type slotRow struct {
	slot   PendingSlot
	passed bool // restart_lsn >= the target
	// notStandby: the WAL sender streaming from it is not a standby's (replayRow.isStandby).
	notStandby bool
}

// readReplayState runs replayStateSQL with target ("" for the flush position) and the slots
// to leave out, and returns the target, the physical WAL senders and the physical slots.
func readReplayState(ctx context.Context, pool *pgxpool.Pool, target string, exceptSlots []string) (string, []replayRow, []slotRow, error) {
	var arg *string
	if target != "" {
		arg = &target
	}
	rows, err := pool.Query(ctx, replayStateSQL, arg, exceptSlots)
	if err != nil {
		return "", nil, nil, err
	}
	var senders []replayRow
	var slots []slotRow
	for rows.Next() {
		var r replayRow
		var s slotRow
		var pid *int32
		var slot *string
		if err := rows.Scan(&target, &pid, &r.standby.ApplicationName, &r.standby.ClientAddr, &r.visible,
			&r.state, &r.replied, &r.standby.ReplayLSN, &r.replayed,
			&slot, &s.slot.Active, &s.slot.RestartLSN, &s.passed); err != nil {
			rows.Close()
			return "", nil, nil, err
		}
		if pid != nil {
			r.pid = *pid
			senders = append(senders, r)
			s.notStandby = !r.isStandby()
		}
		if slot != nil {
			s.slot.Name = *slot
			slots = append(slots, s)
		}
	}
	return target, senders, slots, rows.Err()
}

// awaitStandbyReplay waits until every physical standby streaming from the server behind pool
// right after the rebase's commit has replayed that commit, and every physical replication
// slot with a position then (but those in exceptSlots) has passed it, or ctx ends (see
// RebaseTokenEpoch). epoch is the rebase's, for the error.
func awaitStandbyReplay(ctx context.Context, pool *pgxpool.Pool, epoch uint32, exceptSlots []string) error {
	fail := func(target string, pending []*replayRow, pendingSlots []PendingSlot, cause error) error {
		e := &RebaseReplayError{Epoch: epoch, LSN: target, Slots: pendingSlots, Cause: cause}
		for _, p := range pending {
			e.Standbys = append(e.Standbys, p.standby)
		}
		return e
	}
	target, rows, slots, err := readReplayState(ctx, pool, "", exceptSlots)
	if err != nil && ctx.Err() != nil {
		// ctx ended as the rebase committed: still read whom it should have waited for,
		// within a bound of its own, so that the error names them (or there are none).
		sctx, cancel := detached(ctx, replaySnapshotTimeout)
		target, rows, slots, err = readReplayState(sctx, pool, "", exceptSlots)
		cancel()
	}
	if err != nil {
		return fail("", nil, nil, fmt.Errorf("read pg_stat_replication: %w", err))
	}
	// The standbys to wait for, by WAL sender pid; all the snapshot's senders, for telling a
	// reconnected standby's new sender from an old one. The slots to wait for, by name.
	var pending []*replayRow
	known := make(map[int32]bool, len(rows))
	for i := range rows {
		known[rows[i].pid] = true
		if rows[i].isStandby() {
			pending = append(pending, &rows[i])
		}
	}
	var pendingSlots []PendingSlot
	for _, s := range slots {
		pendingSlots = append(pendingSlots, s.slot)
	}
	start := time.Now()
	poll, nudgeEvery := replayPollFirst, replayNudgeFirst
	nudgeAt := start.Add(nudgeEvery)
	for {
		pending = pendingStandbys(pending, rows, known)
		pendingSlots = pendingSlotsOf(pendingSlots, slots)
		if len(pending) == 0 && len(pendingSlots) == 0 {
			return nil
		}
		for _, p := range pending {
			if !p.visible {
				return fail(target, pending, pendingSlots, ErrReplayNotVisible)
			}
		}
		if ctx.Err() != nil {
			return fail(target, pending, pendingSlots, ctx.Err())
		}
		if now := time.Now(); !now.Before(nudgeAt) {
			// Best effort: if it fails, the standbys still report at their next status
			// message, and the next read of pg_stat_replication says what is wrong.
			_, _ = pool.Exec(ctx, replayNudgeSQL)
			nudgeEvery = min(2*nudgeEvery, replayNudgeMax)
			nudgeAt = now.Add(nudgeEvery)
		}
		timer := time.NewTimer(poll)
		select {
		case <-ctx.Done():
			timer.Stop()
			return fail(target, pending, pendingSlots, ctx.Err())
		case <-timer.C:
		}
		poll = min(2*poll, replayPollMax)
		if _, rows, slots, err = readReplayState(ctx, pool, target, exceptSlots); err != nil {
			if ctx.Err() != nil {
				return fail(target, pending, pendingSlots, ctx.Err())
			}
			return fail(target, pending, pendingSlots, fmt.Errorf("read pg_stat_replication: %w", err))
		}
	}
}

// pendingSlotsOf returns those of pending that slots (the physical slots with a position now)
// do not show as having passed the target, with their position now. A slot gone from slots
// (dropped, or invalidated) is dropped: no standby resumes from it. So is one whose WAL sender
// turned out not to be a standby's (pg_receivewal, pg_basebackup's WAL stream), as
// pendingStandbys drops such a sender.
func pendingSlotsOf(pending []PendingSlot, slots []slotRow) []PendingSlot {
	byName := make(map[string]slotRow, len(slots))
	for _, s := range slots {
		byName[s.slot.Name] = s
	}
	out := pending[:0]
	for _, p := range pending {
		if s, ok := byName[p.Name]; ok && !s.passed && !s.notStandby {
			out = append(out, s.slot)
		}
	}
	return out
}

// pendingStandbys returns those of pending that rows (the WAL senders now) do not show as
// having replayed the target, with their last replay position. A standby whose sender is gone
// has replayed once a new sender (a pid not in known) of the same application_name and
// client_addr has, each new sender vouching for one standby. A sender that turned out to
// report no replay position is dropped.
func pendingStandbys(pending []*replayRow, rows []replayRow, known map[int32]bool) []*replayRow {
	byPID := make(map[int32]*replayRow, len(rows))
	for i := range rows {
		byPID[rows[i].pid] = &rows[i]
	}
	claimed := make(map[int32]bool)
	var out []*replayRow
	for _, p := range pending {
		if r, ok := byPID[p.pid]; ok {
			if r.replayed || !r.isStandby() {
				continue
			}
			*p = *r
			out = append(out, p)
			continue
		}
		reconnected := false
		for i := range rows {
			r := &rows[i]
			if !known[r.pid] && !claimed[r.pid] && r.replayed &&
				r.standby.ApplicationName == p.standby.ApplicationName && r.standby.ClientAddr == p.standby.ClientAddr {
				claimed[r.pid], reconnected = true, true
				break
			}
		}
		if !reconnected {
			p.standby.Disconnected = true
			out = append(out, p)
		}
	}
	return out
}
