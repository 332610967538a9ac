//! Join tokens: short-lived, role-bound permits to enrol a node, minted and checked only by
//! whoever holds the cluster CA's key.
//!
//! A token reads `rudra1.ROLE.EXPIRY.USES.ID.MAC`: the role it admits (`shard` or
//! `learner`), its expiry in Unix seconds, how many nodes may enrol with it, a random id, and
//! an HMAC-SHA256 (truncated to 128 bits) over everything before it, keyed by a secret derived
//! from the CA key. Nodes store nothing and cannot forge one; the scheduler (the CA holder)
//! checks the MAC, the expiry and the role, and counts uses by id to refuse replays.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};

use crate::{Role, TransportError};

/// The prefix (and version) of every token.
const PREFIX: &str = "rudra1";
/// MAC bytes kept.
const MAC_LEN: usize = 16;
/// The longest text read as a join token (a real one is about 90 bytes).
pub const MAX_TOKEN: usize = 256;

/// A token's contents, as minted or as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinToken {
    /// The role a node enrolling with it takes.
    pub role: Role,
    /// Unix seconds after which it is refused.
    pub expires: u64,
    /// How many enrolments it allows.
    pub uses: u32,
    /// Its random id: what replays are counted by.
    pub id: String,
}

/// Why a token was refused: what the scheduler logs and tells the node.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenRefusal {
    /// Far longer than any token.
    #[error("is {len} bytes; a join token is at most {MAX_TOKEN}: make one with `rudra-node cert token`")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Not a token at all.
    #[error(
        "not a join token (expected rudra1.ROLE.EXPIRY.USES.ID.MAC); make one with `rudra-node cert token`"
    )]
    Malformed,
    /// Well formed, but not minted with this cluster's CA.
    #[error("unknown token: not minted by this cluster's CA")]
    Unknown,
    /// Minted for another role.
    #[error("the token admits a {token}, this node asks to join as a {asked}")]
    WrongRole {
        /// The token's role.
        token: &'static str,
        /// The role asked for.
        asked: &'static str,
    },
    /// Past its expiry.
    #[error("the token expired {ago} s ago; make a new one with `rudra-node cert token`")]
    Expired {
        /// Seconds since it expired.
        ago: u64,
    },
    /// Every use it allows has been taken.
    #[error("replayed: the token allows {uses} enrolment(s) and all were taken")]
    Replayed {
        /// Its allowance.
        uses: u32,
    },
}

impl fmt::Display for JoinToken {
    /// The token's body, without its MAC.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}.{}.{}.{}.{}", self.role.as_str(), self.expires, self.uses, self.id)
    }
}

/// The key that mints and checks tokens: derived from the CA key, so only the CA holder has it.
pub struct TokenKey(hmac::Key);

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl TokenKey {
    /// The token key of the CA whose private key (DER) is `ca_key_der`.
    #[must_use]
    pub fn from_ca_key(ca_key_der: &[u8]) -> Self {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"rudra join tokens");
        ctx.update(&[0]);
        ctx.update(ca_key_der);
        Self(hmac::Key::new(hmac::HMAC_SHA256, ctx.finish().as_ref()))
    }

    fn mac(&self, body: &str) -> String {
        hex(&hmac::sign(&self.0, body.as_bytes()).as_ref()[..MAC_LEN])
    }

    /// A new token for `role`, valid for `ttl` from now and for `uses` enrolments.
    pub fn mint(&self, role: Role, ttl: Duration, uses: u32) -> Result<String, TransportError> {
        if role == Role::Scheduler {
            return Err(TransportError::Tls(
                "the scheduler holds the CA and enrols no one to its role; make tokens for shard or learner"
                    .into(),
            ));
        }
        if uses == 0 {
            return Err(TransportError::Tls("a token must allow at least one use".into()));
        }
        let mut id = [0u8; 8];
        SystemRandom::new()
            .fill(&mut id)
            .map_err(|_| TransportError::Tls("the system gave no random bytes for a token id".into()))?;
        let token = JoinToken { role, expires: unix_now().saturating_add(ttl.as_secs()), uses, id: hex(&id) };
        let body = token.to_string();
        Ok(format!("{body}.{}", self.mac(&body)))
    }

    /// Check `text`'s MAC and expiry, and that it admits `role`; returns what it says. Uses are
    /// counted by whoever keeps the record of them (see [`JoinToken::id`]).
    pub fn check(&self, text: &str, role: Role) -> Result<JoinToken, TokenRefusal> {
        self.check_at(text, role, unix_now())
    }

    fn check_at(&self, text: &str, role: Role, now: u64) -> Result<JoinToken, TokenRefusal> {
        let token = parse(text)?;
        let (body, mac) = text.rsplit_once('.').ok_or(TokenRefusal::Malformed)?;
        let expected = hmac::sign(&self.0, body.as_bytes());
        let given = (0..mac.len())
            .step_by(2)
            .map(|i| mac.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
            .collect::<Option<Vec<u8>>>()
            .ok_or(TokenRefusal::Malformed)?;
        // Every byte compared, whatever the first difference: no timing tells how much matched.
        let diff = given.iter().zip(&expected.as_ref()[..MAC_LEN]).fold(0u8, |acc, (a, b)| acc | (a ^ b));
        let same = given.len() == MAC_LEN && diff == 0;
        if !same {
            return Err(TokenRefusal::Unknown);
        }
        if token.role != role {
            return Err(TokenRefusal::WrongRole { token: token.role.as_str(), asked: role.as_str() });
        }
        if now > token.expires {
            return Err(TokenRefusal::Expired { ago: now - token.expires });
        }
        Ok(token)
    }
}

/// Read a token's fields without checking its MAC (a node does this to fail early on a token
/// that is not one, and to learn its role).
pub fn parse(text: &str) -> Result<JoinToken, TokenRefusal> {
    if text.len() > MAX_TOKEN {
        return Err(TokenRefusal::TooLong { len: text.len() });
    }
    let parts: Vec<&str> = text.trim().split('.').collect();
    let [prefix, role, expires, uses, id, mac] = parts[..] else { return Err(TokenRefusal::Malformed) };
    let role = match role {
        "shard" => Role::Shard,
        "learner" => Role::Learner,
        "aggregator" => Role::Aggregator,
        _ => return Err(TokenRefusal::Malformed),
    };
    let hexish = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if prefix != PREFIX || !hexish(id, 16) || !hexish(mac, 2 * MAC_LEN) {
        return Err(TokenRefusal::Malformed);
    }
    let expires = expires.parse().map_err(|_| TokenRefusal::Malformed)?;
    let uses = uses.parse().map_err(|_| TokenRefusal::Malformed)?;
    Ok(JoinToken { role, expires, uses, id: id.to_owned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_admit_their_role_until_they_expire_and_only_under_their_ca() {
        let key = TokenKey::from_ca_key(b"a CA key");
        let other = TokenKey::from_ca_key(b"another CA key");
        let hour = Duration::from_secs(3600);
        let t = key.mint(Role::Learner, hour, 4).unwrap();
        let read = key.check(&t, Role::Learner).unwrap();
        assert_eq!((read.role, read.uses, read.id.len()), (Role::Learner, 4, 16));
        assert!(read.expires >= unix_now() + 3599 && read.expires <= unix_now() + 3600);
        assert_eq!(parse(&t).unwrap(), read);
        assert_eq!(
            key.check(&t, Role::Shard),
            Err(TokenRefusal::WrongRole { token: "learner", asked: "shard" })
        );
        assert_eq!(other.check(&t, Role::Learner), Err(TokenRefusal::Unknown));
        // Any change to the body breaks the MAC: more uses, a later expiry, another role.
        let (body, mac) = t.rsplit_once('.').unwrap();
        for (forged, role) in [
            (body.replace(".4.", ".9."), Role::Learner),
            (body.replace(&read.expires.to_string(), &(read.expires + 1).to_string()), Role::Learner),
            (body.replace("learner", "shard"), Role::Shard),
        ] {
            assert_eq!(key.check(&format!("{forged}.{mac}"), role), Err(TokenRefusal::Unknown), "{forged}");
        }
        assert_eq!(key.check_at(&t, Role::Learner, read.expires).map(|t| t.uses), Ok(4), "the last second");
        assert_eq!(key.check_at(&t, Role::Learner, read.expires + 5), Err(TokenRefusal::Expired { ago: 5 }));
        for bad in
            ["", "rudra1", "rudra1.learner.1.1.00.00", &t.replace("rudra1", "rudra2"), &format!("{t}.x")]
        {
            assert_eq!(key.check(bad, Role::Learner), Err(TokenRefusal::Malformed), "{bad}");
        }
        assert!(key.mint(Role::Scheduler, hour, 1).is_err());
        assert!(key.mint(Role::Learner, hour, 0).is_err());
    }
}
