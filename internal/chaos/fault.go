package chaos

import "context"

// Fault is a fault a scenario injects: Inject puts it in effect and returns, Heal ends it
// (for faults that end by themselves, such as a kill, Heal does what recovery needs, or
// nothing).
type Fault interface {
	// Name names the fault in reports, e.g. "sigstop" or "crash-server".
	Name() string
	// Inject puts the fault in effect.
	Inject(ctx context.Context) error
	// Heal ends the fault.
	Heal(ctx context.Context) error
}

// FaultFuncs is a [Fault] made of two functions; a nil function does nothing.
type FaultFuncs struct {
	Label      string
	InjectFunc func(ctx context.Context) error
	HealFunc   func(ctx context.Context) error
}

// Name returns f.Label.
func (f FaultFuncs) Name() string { return f.Label }

// Inject calls f.InjectFunc.
func (f FaultFuncs) Inject(ctx context.Context) error {
	if f.InjectFunc == nil {
		return nil
	}
	return f.InjectFunc(ctx)
}

// Heal calls f.HealFunc.
func (f FaultFuncs) Heal(ctx context.Context) error {
	if f.HealFunc == nil {
		return nil
	}
	return f.HealFunc(ctx)
}
