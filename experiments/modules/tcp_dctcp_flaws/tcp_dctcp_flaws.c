// SPDX-License-Identifier: GPL-2.0-or-later
/*
 * tcp_dctcp_flaws: DCTCP with the DCTCP-flaws study's variant letters as module parameters
 * (experiments/README.md#dctcp-flaws; the letter code DCTCP-<P|p><S|s><10|20><T|t><U|u> of
 * experiments/dctcp-flaws/ plans). Registers the congestion control "dctcp_flaws".
 *
 * The algorithm is Linux 6.1's net/ipv4/tcp_dctcp.c (linux-source-6.1 6.1.192, the VM lab guest's
 * series; authors below). With every parameter at its default (P10Tu, g = 1/16, alpha 1024 at init) it
 * computes what that file computes. The parameters (/sys/module/tcp_dctcp_flaws/parameters/, all
 * writable, each read once per connection when it starts, so a change affects later connections only):
 *
 *   dctcp_shift_g        0..10, default 4: EWMA gain g = 1/2^shift_g,
 *                        alpha = (1 - g) alpha + g F, F the fraction of CE-marked bytes in the last window.
 *   dctcp_alpha_on_init  0..1024, default 1024: alpha of a new connection, in 1/1024.
 *   alpha_bits           10 (default, upstream) or 20: fixed-point bits alpha is kept in.
 *   alpha_toggle         1 (default, upstream since v4.3, c80dbe0): the decay subtracts
 *                        min_not_zero(alpha, alpha >> g), so once alpha >> g is 0 alpha drops to 0 in one
 *                        window ("toggles to zero"); 0: it subtracts alpha >> g, which stops decaying at
 *                        2^g - 1 (alpha's floor).
 *   alpha_upscale        0 (default, upstream); 1: alpha is stored multiplied by 2^g, so the decay keeps
 *                        g more bits (the study's "upscaled alpha").
 *   prr                  1 (default, upstream): after a reduction (CE echo or loss) the kernel's PRR brings
 *                        cwnd down to ssthresh over about one RTT; 0: the module implements cong_control and
 *                        sets cwnd to ssthresh at once (PRR bypassed), keeping the pacing rate itself.
 *   loss_halve           1 (default, upstream since 5.1): on entering fast recovery or on an RTO,
 *                        ssthresh = cwnd / 2; 0: reduce by alpha / 2 as on a CE echo.
 *
 * ss -ti shows `dctcp:(ce_state:..,alpha:N,..)` with N in 1/1024 whatever alpha_bits and alpha_upscale.
 */
#include <linux/module.h>
#include <linux/mm.h>
#include <linux/math64.h>
#include <net/tcp.h>
#include <linux/inet_diag.h>

#define DCTCP_MAX_ALPHA_10 1024U

struct dctcp_flaws {
	u32 old_delivered;
	u32 old_delivered_ce;
	u32 prior_rcv_nxt;
	u32 alpha;		/* in 1/2^bits, times 2^shift_g when upscale */
	u32 next_seq;
	u32 ce_state;
	u32 loss_cwnd;
	u8 shift_g;		/* the parameters, as the connection started */
	u8 bits;
	u8 toggle:1, upscale:1, prr:1, loss_halve:1;
};

static unsigned int dctcp_shift_g __read_mostly = 4;
static unsigned int dctcp_alpha_on_init __read_mostly = DCTCP_MAX_ALPHA_10;
static unsigned int alpha_bits __read_mostly = 10;
static unsigned int alpha_toggle __read_mostly = 1;
static unsigned int alpha_upscale __read_mostly;
static unsigned int prr __read_mostly = 1;
static unsigned int loss_halve __read_mostly = 1;

#define UINT_PARAM(name, lo, hi, desc)						\
	static int name##_set(const char *val, const struct kernel_param *kp)	\
	{									\
		return param_set_uint_minmax(val, kp, lo, hi);			\
	}									\
	static const struct kernel_param_ops name##_ops = {			\
		.set = name##_set,						\
		.get = param_get_uint,						\
	};									\
	module_param_cb(name, &name##_ops, &name, 0644);			\
	MODULE_PARM_DESC(name, desc)

UINT_PARAM(dctcp_shift_g, 0, 10, "EWMA gain g = 1/2^dctcp_shift_g (0..10, default 4)");
UINT_PARAM(dctcp_alpha_on_init, 0, DCTCP_MAX_ALPHA_10, "initial alpha in 1/1024 (0..1024, default 1024)");
UINT_PARAM(alpha_toggle, 0, 1, "1: decay by min_not_zero(alpha, alpha >> g) (upstream); 0: by alpha >> g");
UINT_PARAM(alpha_upscale, 0, 1, "1: keep alpha multiplied by 2^g; 0: not (upstream)");
UINT_PARAM(prr, 0, 1, "1: cwnd reduction through the kernel's PRR (upstream); 0: cwnd = ssthresh at once");
UINT_PARAM(loss_halve, 0, 1, "1: on loss ssthresh = cwnd/2 (upstream); 0: reduce by alpha/2");

static int alpha_bits_set(const char *val, const struct kernel_param *kp)
{
	unsigned int v;
	int ret = kstrtouint(val, 0, &v);

	if (ret)
		return ret;
	if (v != 10 && v != 20)
		return -EINVAL;
	*(unsigned int *)kp->arg = v;
	return 0;
}

static const struct kernel_param_ops alpha_bits_ops = {
	.set = alpha_bits_set,
	.get = param_get_uint,
};
module_param_cb(alpha_bits, &alpha_bits_ops, &alpha_bits, 0644);
MODULE_PARM_DESC(alpha_bits, "fixed-point bits of alpha: 10 (upstream) or 20");

static struct tcp_congestion_ops dctcp_flaws_reno;
static struct tcp_congestion_ops dctcp_flaws_noprr;

/* alpha in 1/2^bits (without the upscaling) */
static inline u32 ca_alpha(const struct dctcp_flaws *ca)
{
	u32 a = READ_ONCE(ca->alpha);

	return ca->upscale ? a >> ca->shift_g : a;
}

static void dctcp_flaws_reset(const struct tcp_sock *tp, struct dctcp_flaws *ca)
{
	ca->next_seq = tp->snd_nxt;
	ca->old_delivered = tp->delivered;
	ca->old_delivered_ce = tp->delivered_ce;
}

static void dctcp_flaws_init(struct sock *sk)
{
	const struct tcp_sock *tp = tcp_sk(sk);

	if ((tp->ecn_flags & TCP_ECN_OK) ||
	    (sk->sk_state == TCP_LISTEN || sk->sk_state == TCP_CLOSE)) {
		struct dctcp_flaws *ca = inet_csk_ca(sk);
		u32 alpha;

		ca->shift_g = READ_ONCE(dctcp_shift_g);
		ca->bits = READ_ONCE(alpha_bits);
		ca->toggle = READ_ONCE(alpha_toggle);
		ca->upscale = READ_ONCE(alpha_upscale);
		ca->prr = READ_ONCE(prr);
		ca->loss_halve = READ_ONCE(loss_halve);
		alpha = min(READ_ONCE(dctcp_alpha_on_init), DCTCP_MAX_ALPHA_10) << (ca->bits - 10);
		ca->alpha = ca->upscale ? alpha << ca->shift_g : alpha;
		ca->prior_rcv_nxt = tp->rcv_nxt;
		ca->loss_cwnd = 0;
		ca->ce_state = 0;
		dctcp_flaws_reset(tp, ca);
		if (!ca->prr)
			WRITE_ONCE(inet_csk(sk)->icsk_ca_ops, &dctcp_flaws_noprr);
		return;
	}
	/* No ECN: Reno, and no ECT on this socket (as upstream). */
	WRITE_ONCE(inet_csk(sk)->icsk_ca_ops, &dctcp_flaws_reno);
	INET_ECN_dontxmit(sk);
}

static u32 alpha_reduced(const struct tcp_sock *tp, const struct dctcp_flaws *ca)
{
	u64 cut = ((u64)tcp_snd_cwnd(tp) * ca_alpha(ca)) >> (ca->bits + 1);

	return max(tcp_snd_cwnd(tp) - (u32)cut, 2U);
}

static u32 dctcp_flaws_ssthresh(struct sock *sk)
{
	struct dctcp_flaws *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	ca->loss_cwnd = tcp_snd_cwnd(tp);
	return alpha_reduced(tp, ca);
}

static void dctcp_flaws_update_alpha(struct sock *sk, u32 flags)
{
	const struct tcp_sock *tp = tcp_sk(sk);
	struct dctcp_flaws *ca = inet_csk_ca(sk);

	/* Expired RTT */
	if (!before(tp->snd_una, ca->next_seq)) {
		u64 delivered_ce = tp->delivered_ce - ca->old_delivered_ce;
		u32 up = ca->upscale ? ca->shift_g : 0;
		u32 alpha = ca->alpha;

		/* alpha = (1 - g) * alpha + g * F, in the stored units */
		if (ca->toggle)
			alpha -= min_not_zero(alpha, alpha >> ca->shift_g);
		else
			alpha -= alpha >> ca->shift_g;
		if (delivered_ce) {
			u32 delivered = tp->delivered - ca->old_delivered;

			delivered_ce <<= (ca->bits + up - ca->shift_g);
			delivered_ce = div_u64(delivered_ce, max(1U, delivered));
			alpha = (u32)min_t(u64, alpha + delivered_ce, (u64)1 << (ca->bits + up));
		}
		WRITE_ONCE(ca->alpha, alpha);
		dctcp_flaws_reset(tp, ca);
	}
}

static void dctcp_flaws_react_to_loss(struct sock *sk)
{
	struct dctcp_flaws *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	ca->loss_cwnd = tcp_snd_cwnd(tp);
	tp->snd_ssthresh = ca->loss_halve ? max(tcp_snd_cwnd(tp) >> 1U, 2U) : alpha_reduced(tp, ca);
}

static void dctcp_flaws_state(struct sock *sk, u8 new_state)
{
	if (new_state == TCP_CA_Recovery && new_state != inet_csk(sk)->icsk_ca_state)
		dctcp_flaws_react_to_loss(sk);
}

/* net/ipv4/tcp_dctcp.h of 6.1, renamed */
static void dctcp_flaws_ece_ack_cwr(struct sock *sk, u32 ce_state)
{
	struct tcp_sock *tp = tcp_sk(sk);

	if (ce_state == 1)
		tp->ecn_flags |= TCP_ECN_DEMAND_CWR;
	else
		tp->ecn_flags &= ~TCP_ECN_DEMAND_CWR;
}

static void dctcp_flaws_ece_ack_update(struct sock *sk, enum tcp_ca_event evt, u32 *prior_rcv_nxt,
				       u32 *ce_state)
{
	u32 new_ce_state = (evt == CA_EVENT_ECN_IS_CE) ? 1 : 0;

	if (*ce_state != new_ce_state) {
		if (inet_csk(sk)->icsk_ack.pending & ICSK_ACK_TIMER) {
			dctcp_flaws_ece_ack_cwr(sk, *ce_state);
			__tcp_send_ack(sk, *prior_rcv_nxt);
		}
		inet_csk(sk)->icsk_ack.pending |= ICSK_ACK_NOW;
	}
	*prior_rcv_nxt = tcp_sk(sk)->rcv_nxt;
	*ce_state = new_ce_state;
	dctcp_flaws_ece_ack_cwr(sk, new_ce_state);
}

static void dctcp_flaws_cwnd_event(struct sock *sk, enum tcp_ca_event ev)
{
	struct dctcp_flaws *ca = inet_csk_ca(sk);

	switch (ev) {
	case CA_EVENT_ECN_IS_CE:
	case CA_EVENT_ECN_NO_CE:
		dctcp_flaws_ece_ack_update(sk, ev, &ca->prior_rcv_nxt, &ca->ce_state);
		break;
	case CA_EVENT_LOSS:
		dctcp_flaws_react_to_loss(sk);
		break;
	default:
		break;
	}
}

static size_t dctcp_flaws_get_info(struct sock *sk, u32 ext, int *attr, union tcp_cc_info *info)
{
	const struct dctcp_flaws *ca = inet_csk_ca(sk);
	const struct tcp_sock *tp = tcp_sk(sk);

	if (ext & (1 << (INET_DIAG_DCTCPINFO - 1)) || ext & (1 << (INET_DIAG_VEGASINFO - 1))) {
		memset(&info->dctcp, 0, sizeof(info->dctcp));
		if (READ_ONCE(inet_csk(sk)->icsk_ca_ops) != &dctcp_flaws_reno) {
			info->dctcp.dctcp_enabled = 1;
			info->dctcp.dctcp_ce_state = (u16)ca->ce_state;
			info->dctcp.dctcp_alpha = ca_alpha(ca) >> (ca->bits - 10);
			info->dctcp.dctcp_ab_ecn = tp->mss_cache * (tp->delivered_ce - ca->old_delivered_ce);
			info->dctcp.dctcp_ab_tot = tp->mss_cache * (tp->delivered - ca->old_delivered);
		}
		*attr = INET_DIAG_DCTCPINFO;
		return sizeof(info->dctcp);
	}
	return 0;
}

static u32 dctcp_flaws_cwnd_undo(struct sock *sk)
{
	const struct dctcp_flaws *ca = inet_csk_ca(sk);
	struct tcp_sock *tp = tcp_sk(sk);

	return max(tcp_snd_cwnd(tp), ca->loss_cwnd);
}

/* both variants of the congestion control (with the kernel's PRR or not): all but how cwnd moves */
#define DCTCP_FLAWS_OPS						\
	.init		= dctcp_flaws_init,			\
	.in_ack_event	= dctcp_flaws_update_alpha,		\
	.cwnd_event	= dctcp_flaws_cwnd_event,		\
	.ssthresh	= dctcp_flaws_ssthresh,			\
	.undo_cwnd	= dctcp_flaws_cwnd_undo,		\
	.set_state	= dctcp_flaws_state,			\
	.get_info	= dctcp_flaws_get_info,			\
	.flags		= TCP_CONG_NEEDS_ECN,			\
	.owner		= THIS_MODULE,				\
	.name		= "dctcp_flaws"

static struct tcp_congestion_ops dctcp_flaws __read_mostly = {
	DCTCP_FLAWS_OPS,
	.cong_avoid	= tcp_reno_cong_avoid,
};

/* prr = 0: instead of the kernel's PRR (tcp_cwnd_reduction) while in CWR or Recovery, cwnd goes to ssthresh at
 * once; otherwise Reno's increase. The kernel leaves the pacing rate to a cong_control module: the same
 * formula as its tcp_update_pacing_rate (net/ipv4/tcp_input.c). */
static void dctcp_flaws_cong_control(struct sock *sk, const struct rate_sample *rs)
{
	struct tcp_sock *tp = tcp_sk(sk);
	const struct net *net = sock_net(sk);
	u64 rate;

	if (tcp_in_cwnd_reduction(sk)) {
		if (tcp_snd_cwnd(tp) > tp->snd_ssthresh)
			tcp_snd_cwnd_set(tp, max(tp->snd_ssthresh, 2U));
	} else if (rs->acked_sacked > 0) {
		tcp_reno_cong_avoid(sk, tp->snd_una, rs->acked_sacked);
	}
	rate = (u64)tp->mss_cache * ((USEC_PER_SEC / 100) << 3);
	if (tcp_snd_cwnd(tp) < tp->snd_ssthresh / 2)
		rate *= READ_ONCE(net->ipv4.sysctl_tcp_pacing_ss_ratio);
	else
		rate *= READ_ONCE(net->ipv4.sysctl_tcp_pacing_ca_ratio);
	rate *= max(tcp_snd_cwnd(tp), tp->packets_out);
	if (likely(tp->srtt_us))
		rate = div64_u64(rate, tp->srtt_us);
	WRITE_ONCE(sk->sk_pacing_rate, min_t(u64, rate, READ_ONCE(sk->sk_max_pacing_rate)));
}

static struct tcp_congestion_ops dctcp_flaws_noprr __read_mostly = {
	DCTCP_FLAWS_OPS,
	.cong_control	= dctcp_flaws_cong_control,
};

static struct tcp_congestion_ops dctcp_flaws_reno __read_mostly = {
	.ssthresh	= tcp_reno_ssthresh,
	.cong_avoid	= tcp_reno_cong_avoid,
	.undo_cwnd	= tcp_reno_undo_cwnd,
	.get_info	= dctcp_flaws_get_info,
	.owner		= THIS_MODULE,
	.name		= "dctcp_flaws-reno",
};

static int __init dctcp_flaws_register(void)
{
	BUILD_BUG_ON(sizeof(struct dctcp_flaws) > ICSK_CA_PRIV_SIZE);
	return tcp_register_congestion_control(&dctcp_flaws);
}

static void __exit dctcp_flaws_unregister(void)
{
	tcp_unregister_congestion_control(&dctcp_flaws);
}

module_init(dctcp_flaws_register);
module_exit(dctcp_flaws_unregister);

MODULE_AUTHOR("Daniel Borkmann <dborkman@redhat.com>");
MODULE_AUTHOR("Florian Westphal <fw@strlen.de>");
MODULE_AUTHOR("Glenn Judd <glenn.judd@morganstanley.com>");
MODULE_AUTHOR("tcplab (the DCTCP-flaws switches)");
MODULE_LICENSE("GPL v2");
MODULE_DESCRIPTION("DCTCP with the DCTCP-flaws study's variant letters as module parameters");
