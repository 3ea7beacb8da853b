package db

// Not generated: sqlc leaves this file alone.

// Statement returns the SQL text of the generated query called name (its sqlc name, such as
// "LeaseRenew"), or "" for an unknown name: for tests that EXPLAIN a statement's plan.
func Statement(name string) string {
	switch name {
	case "LeaseRenew":
		return leaseRenew
	case "LeaseGrant":
		return leaseGrant
	case "LeaseSweep":
		return leaseSweep
	}
	return ""
}
