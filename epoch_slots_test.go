package fencelock_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencelock/fencelock"
)

// RebaseTokenEpochOpts refuses what PostgreSQL refuses as a replication slot name in
// ExceptSlot, and a nil option, with an ArgumentError before any SQL: nothing is rebased. A
// name of 63 characters, and one that no slot has, are accepted. (The wait for slots runs
// against standbys in internal/integration's TestRebaseTokenEpochWaitsForSlot.)
func TestRebaseTokenEpochOptsRefusesBadSlotNames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		name string
		opt  fencelock.RebaseOption
		arg  string
	}{
		{"Empty", fencelock.ExceptSlot(""), "ExceptSlot"},
		{"UpperCase", fencelock.ExceptSlot("Standby_1"), "ExceptSlot"},
		{"Dash", fencelock.ExceptSlot("standby-1"), "ExceptSlot"},
		{"Quote", fencelock.ExceptSlot(`a'b`), "ExceptSlot"},
		{"TooLong", fencelock.ExceptSlot(strings.Repeat("s", 64)), "ExceptSlot"},
		{"Nil", nil, "option"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fencelock.RebaseTokenEpochOpts(b.Ctx, b.Pool, 10, fencelock.ExceptSlot("standby_1"), tc.opt)
			require.ErrorIs(t, err, fencelock.ErrInvalidArgument)
			var aerr *fencelock.ArgumentError
			require.ErrorAs(t, err, &aerr)
			require.Equal(t, tc.arg, aerr.Arg)
		})
	}
	var offset int32
	require.NoError(t, b.Pool.QueryRow(b.Ctx, `SELECT epoch_offset FROM fencelock.token_epoch`).Scan(&offset))
	require.Zero(t, offset, "nothing rebased")

	epoch, err := fencelock.RebaseTokenEpochOpts(b.Ctx, b.Pool, 10,
		fencelock.ExceptSlot(strings.Repeat("s", 63)), fencelock.ExceptSlot("no_such_slot_0"))
	require.NoError(t, err)
	require.EqualValues(t, 10, epoch)
}
