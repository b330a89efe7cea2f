package lowering

// String is Summary, so that printing a report shows its content rather
// than pointers.
func (r Report) String() string { return r.Summary() }

// String is Summary, so that printing a report shows its content rather
// than pointers.
func (r ORTReport) String() string { return r.Summary() }
