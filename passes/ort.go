package passes

import (
	"errors"

	pb "github.com/mokopt/mokopt/graph/onnxpb"
)

// detectORT converts an ONNX Runtime com.microsoft::MoE node.
func (c *ctx) detectORT(n *pb.NodeProto) (*Block, error) {
	return nil, errors.New("com.microsoft::MoE conversion not supported yet")
}
