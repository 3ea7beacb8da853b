package testkit

import "testing"

// BundleWaitFor is [WaitFor] on b's context: it polls cond every 5 ms until it holds, failing
// the test with what when b's context ends first. A test package names it once, as
//
//	var waitFor = testkit.BundleWaitFor[*pgserver.DB]
func BundleWaitFor[D any](t testing.TB, b *Bundle[D], what string, cond func() bool) {
	t.Helper()
	WaitFor(t, b.Ctx, what, cond)
}
