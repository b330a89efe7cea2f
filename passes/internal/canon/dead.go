package canon

import pb "github.com/mokopt/mokopt/graph/onnxpb"

// DropDead removes a default-domain node none of whose outputs is read or
// is a graph output (what other rules leave behind, such as a Split whose
// pieces became Gathers).
var DropDead = Rule{
	Name: "drop-dead",
	Apply: func(w *Work, n *pb.NodeProto) (bool, error) {
		if n.GetDomain() != "" || len(n.Output) == 0 {
			return false, nil
		}
		for _, o := range n.Output {
			if o != "" && (w.G.IsOutput(o) || w.read(o)) {
				return false, nil
			}
		}
		w.Remove(n)
		return true, nil
	},
}
