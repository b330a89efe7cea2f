package eval

import (
	"context"
	"errors"
)

// Exchanger is the one primitive of a simulated group of ranks running
// models in lockstep (package ep's RunRanks): the calling rank contributes
// v and receives every rank's contribution, in rank order, once every rank
// made the same (tag-equal) call at the same position of its sequence.
// Kernels of collective ops reach it through Exchange.
type Exchanger interface {
	Exchange(tag string, v any) (rank int, all []any, err error)
}

// ErrNoGroup is returned by Exchange outside a simulated group.
var ErrNoGroup = errors.New("collective op outside an expert-parallel simulation (run the rank models together: mokopt rewrite --merge-ranks)")

type exchangerKey struct{}

// WithExchanger returns ctx carrying x: kernels run under the returned
// context exchange with x's group.
func WithExchanger(ctx context.Context, x Exchanger) context.Context {
	return context.WithValue(ctx, exchangerKey{}, x)
}

// ExchangerOf returns the Exchanger ctx carries, or nil.
func ExchangerOf(ctx context.Context) Exchanger {
	x, _ := ctx.Value(exchangerKey{}).(Exchanger)
	return x
}

// Exchange runs the collective primitive of the group ctx carries (see
// Exchanger); outside a group it returns ErrNoGroup.
func Exchange(ctx context.Context, tag string, v any) (rank int, all []any, err error) {
	x := ExchangerOf(ctx)
	if x == nil {
		return 0, nil, ErrNoGroup
	}
	return x.Exchange(tag, v)
}
