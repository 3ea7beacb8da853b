package fencelock

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Lock options are typed as the constructors' are: each satisfies its own option type only,
// so passing one where another is expected does not compile; a LockMode is a LockOption. (Job
// options: package job's TestOptionsTyped.)
func TestLockOptionsTyped(t *testing.T) {
	is := func(o any) (lessor, advisory, lock bool) {
		_, lessor = o.(LessorOption)
		_, advisory = o.(AdvisoryOption)
		_, lock = o.(LockOption)
		return
	}
	for _, tc := range []struct {
		desc                   string
		opt                    any
		lessor, advisory, lock bool
	}{
		{"Shared", Shared, false, false, true},
		{"Exclusive", Exclusive, false, false, true},
		{"AtKey", AtKey(Int64Key(1)), false, false, true},
		{"WithMaxSessionLocks", WithMaxSessionLocks(1), false, true, false},
		{"WithLogger", WithLogger(nil), true, true, false},
	} {
		lessor, advisory, lock := is(tc.opt)
		require.Equal(t, []bool{tc.lessor, tc.advisory, tc.lock}, []bool{lessor, advisory, lock}, tc.desc)
	}
}

// A lock call's options resolve to the key and mode it locks; AtKey's key is taken as it is,
// and a name with it only labels the lock.
func TestLockOptionsResolve(t *testing.T) {
	a := &AdvisoryLocker{cfg: advisoryConfig{namespace: DefaultNamespace, hash: SHA256KeyHash}}
	named, err := a.Key("job")
	require.NoError(t, err)
	for _, tc := range []struct {
		desc, name string
		opts       []LockOption
		key        AdvisoryKey
		mode       LockMode
	}{
		{"Default", "job", nil, named, Exclusive},
		{"Shared", "job", []LockOption{Shared}, named, Shared},
		{"SameModeTwice", "job", []LockOption{Shared, Shared}, named, Shared},
		{"AtKeyNoName", "", []LockOption{AtKey(Int32PairKey(7, 8))}, Int32PairKey(7, 8), Exclusive},
		{"AtKeyLabelled", "job", []LockOption{AtKey(Int64Key(5)), Shared}, Int64Key(5), Shared},
		{"AtZeroKey", "", []LockOption{AtKey(AdvisoryKey{})}, Int64Key(0), Exclusive},
		{"SameKeyTwice", "", []LockOption{AtKey(Int64Key(5)), AtKey(Int64Key(5))}, Int64Key(5), Exclusive},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			key, mode, err := a.target(tc.name, tc.opts)
			require.NoError(t, err)
			require.Equal(t, tc.key, key)
			require.Equal(t, tc.mode, mode)
		})
	}
}
