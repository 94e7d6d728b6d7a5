//! GGUF metadata values: the value-type tags and the typed values themselves.

use std::fmt;

/// The on-disk type tag of a GGUF metadata value (`enum gguf_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    /// `u8`, tag 0.
    U8,
    /// `i8`, tag 1.
    I8,
    /// `u16`, tag 2.
    U16,
    /// `i16`, tag 3.
    I16,
    /// `u32`, tag 4.
    U32,
    /// `i32`, tag 5.
    I32,
    /// `f32`, tag 6.
    F32,
    /// `bool` stored as one byte, tag 7.
    Bool,
    /// Length-prefixed UTF-8 string, tag 8.
    String,
    /// Typed array, tag 9.
    Array,
    /// `u64`, tag 10.
    U64,
    /// `i64`, tag 11.
    I64,
    /// `f64`, tag 12.
    F64,
}

impl GgufValueType {
    /// Decodes an on-disk tag.
    pub fn from_id(id: u32) -> Option<GgufValueType> {
        use GgufValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The on-disk tag.
    pub fn id(self) -> u32 {
        use GgufValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Encoded size of one scalar of this type; `None` for strings and arrays,
    /// whose size depends on their content.
    pub fn fixed_size(self) -> Option<u64> {
        use GgufValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// Smallest possible encoded size of one value of this type (an empty
    /// string is 8 bytes, an empty array 12). Used to bound counts read from
    /// a file by the bytes left in it before allocating anything.
    pub fn min_size(self) -> u64 {
        match self {
            GgufValueType::String => 8,
            GgufValueType::Array => 12,
            other => other.fixed_size().unwrap_or(1),
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use GgufValueType::*;
        f.write_str(match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        })
    }
}

/// A typed GGUF array. Nested arrays are not supported (llama.cpp does not
/// produce or accept them).
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    /// Array of `u8`.
    U8(Vec<u8>),
    /// Array of `i8`.
    I8(Vec<i8>),
    /// Array of `u16`.
    U16(Vec<u16>),
    /// Array of `i16`.
    I16(Vec<i16>),
    /// Array of `u32`.
    U32(Vec<u32>),
    /// Array of `i32`.
    I32(Vec<i32>),
    /// Array of `f32`.
    F32(Vec<f32>),
    /// Array of `bool`.
    Bool(Vec<bool>),
    /// Array of strings.
    String(Vec<String>),
    /// Array of `u64`.
    U64(Vec<u64>),
    /// Array of `i64`.
    I64(Vec<i64>),
    /// Array of `f64`.
    F64(Vec<f64>),
}

impl GgufArray {
    /// The element type tag.
    pub fn elem_type(&self) -> GgufValueType {
        match self {
            GgufArray::U8(_) => GgufValueType::U8,
            GgufArray::I8(_) => GgufValueType::I8,
            GgufArray::U16(_) => GgufValueType::U16,
            GgufArray::I16(_) => GgufValueType::I16,
            GgufArray::U32(_) => GgufValueType::U32,
            GgufArray::I32(_) => GgufValueType::I32,
            GgufArray::F32(_) => GgufValueType::F32,
            GgufArray::Bool(_) => GgufValueType::Bool,
            GgufArray::String(_) => GgufValueType::String,
            GgufArray::U64(_) => GgufValueType::U64,
            GgufArray::I64(_) => GgufValueType::I64,
            GgufArray::F64(_) => GgufValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a `u64` if the array holds integers and the value is
    /// non-negative.
    pub fn get_u64(&self, i: usize) -> Option<u64> {
        match self {
            GgufArray::U8(v) => v.get(i).map(|&x| u64::from(x)),
            GgufArray::U16(v) => v.get(i).map(|&x| u64::from(x)),
            GgufArray::U32(v) => v.get(i).map(|&x| u64::from(x)),
            GgufArray::U64(v) => v.get(i).copied(),
            GgufArray::I8(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            GgufArray::I16(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            GgufArray::I32(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            GgufArray::I64(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            _ => None,
        }
    }

    /// All elements as `u64`, if every one is a non-negative integer.
    pub fn to_u64_vec(&self) -> Option<Vec<u64>> {
        (0..self.len()).map(|i| self.get_u64(i)).collect()
    }

    /// Encoded size in bytes of the array payload (type tag, count, elements).
    pub fn encoded_len(&self) -> u64 {
        let header = 4 + 8;
        let body = match self {
            GgufArray::String(v) => v.iter().map(|s| 8 + s.len() as u64).sum(),
            other => other.len() as u64 * other.elem_type().fixed_size().unwrap_or(0),
        };
        header + body
    }
}

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// `u8` value.
    U8(u8),
    /// `i8` value.
    I8(i8),
    /// `u16` value.
    U16(u16),
    /// `i16` value.
    I16(i16),
    /// `u32` value.
    U32(u32),
    /// `i32` value.
    I32(i32),
    /// `f32` value.
    F32(f32),
    /// `bool` value.
    Bool(bool),
    /// String value.
    String(String),
    /// Array value.
    Array(GgufArray),
    /// `u64` value.
    U64(u64),
    /// `i64` value.
    I64(i64),
    /// `f64` value.
    F64(f64),
}

impl GgufValue {
    /// The value's type tag.
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(_) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// The value as a `u64` if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(x) => Some(u64::from(x)),
            GgufValue::U16(x) => Some(u64::from(x)),
            GgufValue::U32(x) => Some(u64::from(x)),
            GgufValue::U64(x) => Some(x),
            GgufValue::I8(x) => u64::try_from(x).ok(),
            GgufValue::I16(x) => u64::try_from(x).ok(),
            GgufValue::I32(x) => u64::try_from(x).ok(),
            GgufValue::I64(x) => u64::try_from(x).ok(),
            _ => None,
        }
    }

    /// The value as an `f32` if it is a float (f64 is narrowed).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(x) => Some(x),
            GgufValue::F64(x) => Some(x as f32),
            _ => None,
        }
    }

    /// The value as a string slice if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The value as a bool if it is one.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as an array if it is one.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Encoded size in bytes of the value payload (without its type tag).
    pub fn encoded_len(&self) -> u64 {
        match self {
            GgufValue::String(s) => 8 + s.len() as u64,
            GgufValue::Array(a) => a.encoded_len(),
            other => other.value_type().fixed_size().unwrap_or(0),
        }
    }
}

impl From<&str> for GgufValue {
    fn from(s: &str) -> Self {
        GgufValue::String(s.to_owned())
    }
}

impl From<String> for GgufValue {
    fn from(s: String) -> Self {
        GgufValue::String(s)
    }
}

impl From<u32> for GgufValue {
    fn from(x: u32) -> Self {
        GgufValue::U32(x)
    }
}

impl From<f32> for GgufValue {
    fn from(x: f32) -> Self {
        GgufValue::F32(x)
    }
}

impl From<bool> for GgufValue {
    fn from(x: bool) -> Self {
        GgufValue::Bool(x)
    }
}

impl From<GgufArray> for GgufValue {
    fn from(a: GgufArray) -> Self {
        GgufValue::Array(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_tags_round_trip() {
        for id in 0..13 {
            let t = GgufValueType::from_id(id).unwrap();
            assert_eq!(t.id(), id);
        }
        assert_eq!(GgufValueType::from_id(13), None);
    }

    #[test]
    fn integer_widening() {
        assert_eq!(GgufValue::U8(7).as_u64(), Some(7));
        assert_eq!(GgufValue::I32(-1).as_u64(), None);
        assert_eq!(GgufValue::I64(5).as_u64(), Some(5));
        assert_eq!(GgufValue::F32(1.0).as_u64(), None);
        let a = GgufArray::I32(vec![1, 2, 3]);
        assert_eq!(a.to_u64_vec(), Some(vec![1, 2, 3]));
        assert_eq!(GgufArray::I32(vec![1, -2]).to_u64_vec(), None);
    }

    #[test]
    fn encoded_lengths() {
        assert_eq!(GgufValue::from("abc").encoded_len(), 11);
        assert_eq!(GgufValue::U32(1).encoded_len(), 4);
        let a = GgufArray::String(vec!["a".into(), "bc".into()]);
        assert_eq!(a.encoded_len(), 12 + 9 + 10);
        assert_eq!(GgufArray::F32(vec![0.0; 3]).encoded_len(), 12 + 12);
    }
}
