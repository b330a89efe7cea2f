package verify

// String is Summary, so that printing a report shows its content.
func (r Report) String() string { return r.Summary() }
