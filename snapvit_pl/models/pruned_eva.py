"""``EvaAttention`` that works with fewer heads than embedding dim / head_dim.

timm's ``EvaAttention.forward`` reshapes the attention output to the *input* width ``C``, which
only holds while ``num_heads * head_dim == C``. After heads are removed it no longer does, so the
surgery swaps the module's class to this subclass: same parameters, same state-dict keys, and a
forward identical to timm's except that it reshapes to ``num_heads * head_dim``.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from timm.layers import apply_rot_embed_cat
from timm.layers.attention import maybe_add_mask, resolve_self_attn_mask
from timm.models.eva import EvaAttention


class PrunedEvaAttention(EvaAttention):
    """EVA attention whose output width follows its (possibly pruned) head count."""

    def forward(
        self,
        x: torch.Tensor,
        rope: Optional[torch.Tensor] = None,
        attn_mask: Optional[torch.Tensor] = None,
        is_causal: bool = False,
    ) -> torch.Tensor:
        B, N, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        if self.qkv is not None:
            if self.q_bias is None:
                qkv = self.qkv(x)
            else:
                qkv_bias = torch.cat((self.q_bias, self.k_bias, self.v_bias))
                if self.qkv_bias_separate:
                    qkv = self.qkv(x)
                    qkv += qkv_bias
                else:
                    qkv = F.linear(x, weight=self.qkv.weight, bias=qkv_bias)
            q, k, v = qkv.reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        else:
            q = self.q_proj(x).reshape(B, N, self.num_heads, -1).transpose(1, 2)
            k = self.k_proj(x).reshape(B, N, self.num_heads, -1).transpose(1, 2)
            v = self.v_proj(x).reshape(B, N, self.num_heads, -1).transpose(1, 2)
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            npt, half = self.num_prefix_tokens, getattr(self, "rotate_half", False)
            q = torch.cat([q[:, :, :npt, :], apply_rot_embed_cat(q[:, :, npt:, :], rope, half=half)], dim=2).type_as(v)
            k = torch.cat([k[:, :, :npt, :], apply_rot_embed_cat(k[:, :, npt:, :], rope, half=half)], dim=2).type_as(v)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, dropout_p=self.attn_drop.p if self.training else 0.0, is_causal=is_causal
            )
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            attn = maybe_add_mask(attn, resolve_self_attn_mask(N, attn, attn_mask, is_causal=is_causal))
            x = self.attn_drop(attn.softmax(dim=-1)) @ v
        x = self.norm(x.transpose(1, 2).reshape(B, N, self.num_heads * self.head_dim))
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))
